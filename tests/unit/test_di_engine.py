"""DI-engine configs (main_config + create_config) run the algorithm and env they
name, with DI-engine's knobs moved to drover's keys, or are refused naming the key."""

import pytest

from common.config import ConfigError
from drover.cli import main as drover
from jobconfig import load_config, resolve_job_config
from jobconfig.di_engine import from_di_engine
from services.coordinator.workflows import check_workflow
from tests.helpers import DI_ENGINE_FILE, EXAMPLES


def create(policy, env):
    return {"env": {"type": env, "import_names": ["somewhere.envs"]}, "policy": {"type": policy}}


def resolved(main, create_config):
    raw, notes = from_di_engine(main, create_config)
    config, warnings = resolve_job_config(raw)
    check_workflow(config)
    return config, notes, warnings


OFF_POLICY = {
    "env": {"collector_env_num": 8, "stop_value": 195},
    "policy": {
        "cuda": False,
        "discount_factor": 0.97,
        "learn": {"update_per_collect": 5, "batch_size": 64, "learning_rate": 0.001},
        "collect": {"n_sample": 8},
    },
}


def test_dqn_on_cartpole_trains_dqn_on_di_engines_cartpole_at_its_replay_ratio():
    config, notes, _ = resolved(OFF_POLICY, create("dqn", "cartpole"))
    assert config.policy.type == "dqn" and config.system.workflow == "async"
    assert config.env.env_id == "CartPole-v0"  # DI-engine's: 200 steps, not v1's 500
    # 5 updates of 64 after every 8 collected steps: 40 samples per inserted item
    assert config.policy.other.replay_buffer.samples_per_insert == 5 * 64 / 8
    assert any("update_per_collect 5" in n for n in notes)


def test_ppo_runs_the_sync_workflow_and_takes_the_discount_where_di_engine_puts_it():
    main = {
        "env": {"stop_value": 195},
        "policy": {
            "learn": {"epoch_per_collect": 2, "batch_size": 64, "update_per_collect": 3},
            "collect": {"n_sample": 256, "discount_factor": 0.9, "gae_lambda": 0.95},
        },
    }
    config, notes, _ = resolved(main, create("ppo", "cartpole"))
    assert config.policy.type == "ppo" and config.system.workflow == "sync"
    assert config.policy.discount_factor == 0.9
    assert config.policy.learn.epoch_per_collect == 2
    assert any("update_per_collect ignored" in n for n in notes)


def test_impala_clips_and_unrolls_move_to_drovers_keys():
    main = {
        "policy": {
            "unroll_len": 16,
            "learn": {"rho_clip_ratio": 1.5, "c_clip_ratio": 0.9, "discount_factor": 0.95},
        }
    }
    config, _, _ = resolved(main, create("impala", "acrobot"))
    assert (config.policy.type, config.env.env_id) == ("impala", "Acrobot-v1")
    assert config.policy.collect.unroll_len == 16
    assert (config.policy.learn.rho_clip, config.policy.learn.c_clip) == (1.5, 0.9)
    assert config.policy.discount_factor == 0.95


def test_sac_on_pendulum_reads_di_engines_actor_and_priority_keys():
    main = {
        "policy": {
            "priority": True,
            "random_collect_size": 500,
            "model": {"action_space": "reparameterization", "twin_critic": True},
            "learn": {"update_per_collect": 1, "batch_size": 128},
            "collect": {"n_sample": 10},
        }
    }
    config, _, warnings = resolved(main, create("sac", "pendulum"))
    assert (config.policy.type, config.env.env_id) == ("sac", "Pendulum-v1")
    assert config.policy.collect.random_collect_size == 500
    assert config.policy.other.replay_buffer.type == "prioritized"
    assert config.policy.other.replay_buffer.samples_per_insert == 12.8
    assert any("twin_critic" in w for w in warnings)  # ignored keys are still said


@pytest.mark.parametrize(
    ("policy", "env", "field", "says"),
    [
        ("discrete_sac", "cartpole", "create_config.policy.type", "continuous"),
        ("ppo_offpolicy", "cartpole", "create_config.policy.type", "on-policy"),
        ("qmix", "cartpole", "create_config.policy.type", "not an algorithm drover runs"),
        ("dqn", "atari_pong", "create_config.env.type", "set env.env_id"),
    ],
)
def test_what_drover_cannot_run_is_refused_naming_the_key(policy, env, field, says):
    with pytest.raises(ConfigError) as err:
        from_di_engine(OFF_POLICY, create(policy, env))
    assert err.value.field == field and says in err.value.message


def test_a_policy_type_that_contradicts_create_config_is_refused():
    main = {"policy": {"type": "ppo"}}
    with pytest.raises(ConfigError) as err:
        from_di_engine(main, create("dqn", "cartpole"))
    assert err.value.field == "policy.type"


def test_an_explicit_env_id_wins_and_old_gym_ids_are_renamed():
    raw, _ = from_di_engine({"env": {"env_id": "CartPole-v1"}}, create("dqn", "cartpole"))
    assert raw["env"]["env_id"] == "CartPole-v1"
    raw, notes = from_di_engine({"env": {"env_id": "LunarLander-v2"}}, create("dqn", "lunarlander"))
    assert raw["env"]["env_id"] == "LunarLander-v3" and notes


def test_a_di_engine_file_is_read_with_its_create_config(tmp_path):
    path = tmp_path / "cartpole_ppo_config.py"
    path.write_text(DI_ENGINE_FILE)
    raw, notes = load_config(path)
    config, _ = resolve_job_config(raw)
    assert (config.policy.type, config.env.env_id) == ("ppo", "CartPole-v0")
    assert "create_config.policy.type ppo -> policy.type ppo" in notes


def test_config_show_prints_the_resolved_config_and_starts_nothing(tmp_path, capsys):
    path = tmp_path / "cartpole_ppo_config.py"
    path.write_text(DI_ENGINE_FILE)
    assert drover(["config", "show", str(path)]) == 0
    shown = capsys.readouterr()
    assert "translated: create_config.env.type cartpole -> env.env_id CartPole-v0" in shown.err
    assert "type: ppo" in shown.out and "workflow: sync" in shown.out
    refused = tmp_path / "cartpole_qmix_config.py"
    refused.write_text(DI_ENGINE_FILE.replace("type='ppo'", "type='qmix'"))
    assert drover(["config", "show", str(refused)]) == 2
    assert "create_config.policy.type" in capsys.readouterr().err


@pytest.mark.parametrize("extra", ["reward_model", "world_model"])
def test_a_reward_or_world_model_is_refused_not_dropped(extra):
    main = {**OFF_POLICY, extra: {"type": "rnd"}}
    with pytest.raises(ConfigError) as err:
        from_di_engine(main, create("dqn", "cartpole"))
    assert err.value.field == extra and "remove" in err.value.message


def test_config_show_checks_the_env_against_the_algorithm(tmp_path, capsys):
    # DQN on Pendulum's continuous actions: refused before any process starts
    path = tmp_path / "pendulum_dqn_config.py"
    path.write_text(
        DI_ENGINE_FILE.replace("type='ppo'", "type='dqn'")
        .replace("type='cartpole'", "type='pendulum'")
        .replace("obs_shape=4, action_shape=2, ", "")
    )
    assert drover(["config", "show", str(path)]) == 2
    assert "DQN needs discrete actions" in capsys.readouterr().err


def test_python_objects_in_a_config_pass_on_as_their_names():
    class Tanh:
        def __repr__(self):
            return "Tanh()"

    main = {"policy": {"model": {"activation": Tanh(), "head": Tanh()}}}
    raw, notes = from_di_engine(main, create("ppo", "pendulum"))
    assert raw["policy"]["model"]["head"] == "Tanh()"
    assert any("policy.model.head: a Python object" in n for n in notes)
    # PPO's model activation is a key drover knows: the object's name is its value.
    assert raw["policy"]["model"]["activation"] == "tanh"
    config, warnings = resolve_job_config(raw)  # a key drover does not know: warned, dropped
    assert any(w.startswith("policy.model.head: unknown key") for w in warnings)
    assert config.policy.model.activation == "tanh"


def test_update_per_collect_is_no_ratio_for_a_fifo_buffer():
    main = {
        "policy": {
            "learn": {"update_per_collect": 4, "batch_size": 16},
            "collect": {"n_sample": 16},
        }
    }
    config, notes, _ = resolved(main, create("impala", "cartpole"))
    assert config.policy.other.replay_buffer.samples_per_insert is None
    assert any("fifo" in n for n in notes)
    # and a ratio a fifo buffer can never keep is refused, not left to hang
    with pytest.raises(ConfigError) as err:
        resolve_job_config(
            {"policy": {"type": "impala", "other": {"replay_buffer": {"samples_per_insert": 4}}}}
        )
    assert err.value.field == "policy.other.replay_buffer.samples_per_insert"


def test_lunarlander_maps_to_gymnasiums_id_and_stops_early_without_box2d(tmp_path, capsys):
    raw, _ = from_di_engine(OFF_POLICY, create("dqn", "lunarlander"))
    assert raw["env"]["env_id"] == "LunarLander-v3"
    path = tmp_path / "lunarlander_dqn_config.py"
    path.write_text(
        DI_ENGINE_FILE.replace("type='ppo'", "type='dqn'")
        .replace("type='cartpole'", "type='lunarlander'")
        .replace("obs_shape=4, action_shape=2, ", "")
    )
    code = drover(["config", "show", str(path)])
    try:
        import Box2D  # noqa: F401
    except ImportError:  # this machine: a clear line naming the env, nothing started
        assert code == 2 and "env.env_id" in capsys.readouterr().err
    else:
        assert code == 0


@pytest.mark.parametrize("where", [("policy",), ("policy", "learn")])
def test_multi_gpu_keeps_its_meaning_wherever_di_engine_puts_it(where):
    policy = {"type": "dqn", "learn": {}}
    (policy if where == ("policy",) else policy["learn"])["multi_gpu"] = True
    main = {"env": {"stop_value": 195}, "policy": policy}
    config, notes, warnings = resolved(main, create("dqn", "cartpole"))
    assert config.policy.learn.multi_gpu is True
    assert not any("multi_gpu" in w for w in warnings)


def test_a_di_engine_r2d2_file_replays_its_sequences():
    raw, notes = load_config(EXAMPLES / "di_engine" / "cartpole_r2d2_config.py")
    config, warnings = resolve_job_config(raw)
    policy = config.policy
    assert policy.type == "r2d2" and warnings == []
    buffer = policy.other.replay_buffer
    assert (buffer.item, buffer.sequence_length, buffer.overlap) == ("sequence", 20, 10)
    assert policy.burnin_step + policy.unroll_len == buffer.sequence_length
    assert any("Ape-X" in note for note in notes)


def test_a_di_engine_r2d2_file_shares_enough_rows_for_every_step_to_be_learned():
    """Half of long sequences with a long burn-in is too little: a sequence learns
    neither its burn-in nor its last nstep rows, so the next must cover them."""
    main = {
        "env": {"stop_value": 20},
        "policy": {"burnin_step": 40, "unroll_len": 40, "nstep": 5, "collect": {"n_sample": 8}},
    }
    config, notes, _ = resolved(main, create("r2d2", "cartpole"))
    buffer = config.policy.other.replay_buffer
    assert (buffer.sequence_length, buffer.overlap) == (80, 45)
    assert any("sharing 45" in note for note in notes)
