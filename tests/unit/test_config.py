import dataclasses
import json
from pathlib import Path

import pytest

from common.config import ConfigError, to_dict
from jobconfig import from_resolved, load_config_file, resolve_job_config, with_spaces


def test_defaults_merge_and_freeze():
    config, warnings = resolve_job_config({"env": {"env_id": "CartPole-v1", "stop_value": 195}})
    assert warnings == []
    assert config.env.stop_value == 195
    assert config.policy.learn.batch_size == 64  # from the defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.env.env_id = "x"  # type: ignore[misc]


def test_an_unknown_key_is_an_error_with_its_suggestion_or_with_strict_false_a_warning():
    raw = {"policy": {"learn": {"lerning_rate": 0.1}}, "env": {"stop_vaule": 1}}
    with pytest.raises(ConfigError) as err:
        resolve_job_config(raw)
    assert err.value.field == "policy.learn.lerning_rate"
    assert err.value.message == (
        "unknown key (did you mean 'learning_rate'?); 1 more "
        "(strict: false makes unknown keys warnings)"
    )
    config, warnings = resolve_job_config({**raw, "strict": False})
    assert warnings == [
        "policy.learn.lerning_rate: unknown key (did you mean 'learning_rate'?)",
        "env.stop_vaule: unknown key (did you mean 'stop_value'?)",
    ]
    assert config.policy.learn.learning_rate == 0.001  # the default: the typo was dropped
    # A key only other algorithms read is valid: named as ignored, never an error.
    _, warnings = resolve_job_config({"policy": {"learn": {"clip_ratio": 0.3}}})
    assert warnings == ["policy.learn.clip_ratio: ignored, dqn does not use it (ppo does)"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"policy": {"learn": {"batch_size": 0}}}, "policy.learn.batch_size"),
        ({"policy": {"learn": {"batch_size": "many"}}}, "policy.learn.batch_size"),
        ({"policy": {"discount_factor": 1.5}}, "policy.discount_factor"),
        ({"policy": {"type": "nope"}}, "policy.type"),
        ({"env": {"collector_env_num": -1}}, "env.collector_env_num"),
        ({"env": "CartPole"}, "env"),
        (
            {"policy": {"other": {"replay_buffer": {"min_size_to_sample": 10**6}}}},
            "policy.other.replay_buffer.min_size_to_sample",
        ),
        (
            {"policy": {"other": {"replay_buffer": {"samples_per_insert": 8, "error_buffer": 1}}}},
            "policy.other.replay_buffer.error_buffer",
        ),
        ({"policy": {"other": {"eps": {"start": 0.1, "end": 0.5}}}}, "policy.other.eps.end"),
    ],
)
def test_invalid_values_name_the_field(raw, field):
    with pytest.raises(ConfigError) as err:
        resolve_job_config(raw)
    assert err.value.field == field


def test_yaml_scientific_notation_becomes_a_number(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  learn:\n    learning_rate: 1e-3\n")
    config, _ = resolve_job_config(load_config_file(path))
    assert config.policy.learn.learning_rate == pytest.approx(1e-3)


def test_python_and_json_configs(tmp_path):
    py = tmp_path / "c.py"
    py.write_text("main_config = dict(env=dict(stop_value=100))\n")
    assert load_config_file(py)["env"]["stop_value"] == 100
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"env": {"stop_value": 5}}))
    assert load_config_file(js)["env"]["stop_value"] == 5
    with pytest.raises(ConfigError, match="no such file"):
        load_config_file(tmp_path / "missing.yaml")
    bad = tmp_path / "c.txt"
    bad.write_text("x")
    with pytest.raises(ConfigError, match="use .yaml"):
        load_config_file(bad)


def test_spaces_fill_in_and_mismatch_is_refused():
    config, _ = resolve_job_config({})
    filled = with_spaces(config, 4, 2)
    assert (filled.policy.model.obs_shape, filled.policy.model.action_shape) == (4, 2)
    given, _ = resolve_job_config({"policy": {"model": {"obs_shape": 3}}})
    with pytest.raises(ConfigError) as err:
        with_spaces(given, 4, 2)
    assert err.value.field == "policy.model.obs_shape"


def test_resolved_config_round_trips_through_json():
    config, _ = resolve_job_config({"env": {"stop_value": 1.0}})
    config = with_spaces(config, 4, 2)
    assert from_resolved(json.loads(json.dumps(to_dict(config)))) == config


def test_configs_nested_too_deep_or_too_large_are_refused():
    deep = {}
    node = deep
    for _ in range(20):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ConfigError, match="nested deeper"):
        resolve_job_config({"env": {"env_kwargs": deep}})
    with pytest.raises(ConfigError, match="more than"):
        resolve_job_config({"env": {"env_kwargs": {"big": list(range(20_000))}}})


def test_every_coordinator_limit_is_settable_and_documented():
    from services.coordinator.core import CoordinatorLimits
    from services.coordinator.settings import CoordinatorSettings, limit_variable

    guide = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    env = {"DROVER_TOKEN": "t"}
    expected = {}
    for i, spec in enumerate(dataclasses.fields(CoordinatorLimits)):
        name = limit_variable(spec.name)
        assert f"`{name}`" in guide, f"{name} is not in docs/operator.md"
        if isinstance(spec.default, tuple):
            env[name], expected[spec.name] = "10.0.0.0/8, host-a", ("10.0.0.0/8", "host-a")
        else:
            value = type(spec.default)(spec.default + i + 1)
            env[name], expected[spec.name] = str(value), value
    limits = CoordinatorSettings.from_env(env).limits
    assert dataclasses.asdict(limits) == {**dataclasses.asdict(CoordinatorLimits()), **expected}


@pytest.mark.parametrize(
    ("raw", "warning"),
    [
        # a key drover has in another section says where
        (
            {"policy": {"learn": {"unroll_len": 8}}},
            "policy.learn.unroll_len: unknown key "
            "(drover has it as policy.collect.unroll_len and policy.unroll_len)",
        ),
        (
            {"policy": {"learn": {"discount_factor": 0.9}}},
            "policy.learn.discount_factor: unknown key (drover has it as policy.discount_factor)",
        ),
        # DI-engine's names say what drover calls them
        (
            {"policy": {"priority": True}},
            "policy.priority: unknown key (DI-engine's name: drover has "
            "policy.other.replay_buffer.type: prioritized)",
        ),
        # a typo gets its suggestion; a different word that shares a part gets none
        (
            {"env": {"stop_vaule": 1}},
            "env.stop_vaule: unknown key (did you mean 'stop_value'?)",
        ),
        ({"policy": {"learn": {"learner": {}}}}, "policy.learn.learner: unknown key"),
        ({"env": {"collector_episode_num": 2}}, "env.collector_episode_num: unknown key"),
    ],
)
def test_unknown_keys_point_across_the_schema_and_only_at_typos(raw, warning):
    assert warning in resolve_job_config({**raw, "strict": False})[1]


def test_keys_of_other_algorithms_are_named_as_ignored():
    _, warnings = resolve_job_config({"policy": {"learn": {"clip_ratio": 0.3}}})
    assert warnings == ["policy.learn.clip_ratio: ignored, dqn does not use it (ppo does)"]
    _, warnings = resolve_job_config({"policy": {"type": "ppo", "other": {"eps": {"end": 0.1}}}})
    assert warnings == ["policy.other.eps.end: ignored, ppo does not use it (c51 and dqn do)"]
    # the algorithm's own keys, and keys every algorithm reads, are not
    _, warnings = resolve_job_config(
        {"policy": {"type": "ppo", "learn": {"clip_ratio": 0.1, "batch_size": 32}}}
    )
    assert warnings == []


def test_a_wildcard_bound_slave_looks_its_address_up_again_at_each_registration(monkeypatch):
    import socket

    from common.settings import SlaveSettings

    addresses = iter(["172.18.0.5", "172.18.0.9"])  # reconnected: another address
    monkeypatch.setattr(socket, "gethostbyname", lambda name: next(addresses))
    settings = SlaveSettings.from_env(8100, {"DROVER_HOST": "0.0.0.0", "DROVER_TOKEN": "t" * 32})
    assert settings.advertise_url == "http://172.18.0.5:8100"
    assert settings.address_now() == "http://172.18.0.9:8100"
    given = SlaveSettings.from_env(
        8100,
        {
            "DROVER_HOST": "0.0.0.0",
            "DROVER_TOKEN": "t" * 32,
            "DROVER_ADVERTISE_URL": "http://collector-0:8100",
        },
    )
    assert given.address_now() == "http://collector-0:8100"  # as given, never looked up


def test_a_misspelled_key_stops_run_and_submit_before_anything_starts(tmp_path, capsys):
    from drover.cli import main
    from tests.helpers import EXAMPLE

    typo = tmp_path / "typo.yaml"
    typo.write_text(f"base: {EXAMPLE}\npolicy: {{learn: {{learning_rat: 0.0042}}}}\n")
    runs = tmp_path / "runs"
    assert main(["run", str(typo), "--runs-dir", str(runs)]) == 2
    said = capsys.readouterr().err
    assert "policy.learn.learning_rat: unknown key (did you mean 'learning_rate'?)" in said
    assert not runs.exists()  # no run folder: nothing started
    # submit: refused before it looks for a coordinator (none answers at this URL)
    url = "http://127.0.0.1:9"
    assert main(["submit", str(typo), "--coordinator", url, "--connect-timeout-s", "0"]) == 2
    assert "learning_rat: unknown key" in capsys.readouterr().err
    # With --allow-unknown-keys: a warning, and the config shows with the default rate.
    shown = main(["config", "show", str(typo), "--allow-unknown-keys"])
    out = capsys.readouterr()
    assert shown == 0 and "warning: policy.learn.learning_rat: unknown key" in out.err
    assert "learning_rate: 0.0023" in out.out and "0.0042" not in out.out  # not the typo


@pytest.mark.parametrize(("section", "verb"), [("sweep", "drover sweep"), ("tune", "drover tune")])
def test_an_experiments_file_run_as_a_job_says_what_runs_it(section, verb):
    with pytest.raises(ConfigError) as err:
        resolve_job_config({section: {}, "strict": False})
    assert err.value.field == section and verb in err.value.message
