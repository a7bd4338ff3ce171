"""Every example config resolves, fits its env and is taken by its workflow: what a
user copies runs, or says why before anything starts."""

import importlib.util
from pathlib import Path

import pytest

from jobconfig import fit_to_env, load_config, resolve_job_config
from services.coordinator.workflows import check_workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = (
    sorted((ROOT / "examples").glob("*.yaml"))
    + sorted((ROOT / "examples" / "mujoco").glob("*.yaml"))
    + sorted((ROOT / "examples" / "di_engine").glob("*.py"))
)
#: What an example's env needs installed (the dev install has all of them).
NEEDS = {"pong": "ale_py", "halfcheetah": "mujoco", "hopper": "mujoco", "minigrid": "minigrid"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_resolves_fits_its_env_and_its_workflow(path):
    for prefix, module in NEEDS.items():
        if path.name.startswith(prefix) and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    raw, _ = load_config(path)
    config, warnings = resolve_job_config(raw)
    # DI-engine's files may hold keys drover ignores (and says so); none is unknown.
    assert not [w for w in warnings if "unknown key" in w], warnings
    if path.suffix == ".yaml":
        assert warnings == [], warnings
    check_workflow(fit_to_env(config))


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples" / "sweeps").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_sweep_example_expands_into_jobs_that_resolve(path):
    from jobconfig.sweep import plan_sweep

    raw, _ = load_config(path)
    sweep, jobs = plan_sweep(raw)
    assert jobs and all(config["system"]["seed"] in sweep.seeds for _, config in jobs)


def test_a_config_file_builds_on_its_base_and_a_circle_of_bases_is_refused(tmp_path):
    from common.config import ConfigError

    (tmp_path / "a.yaml").write_text("env: {env_id: CartPole-v1}\npolicy: {nstep: 3}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("base: ../a.yaml\npolicy: {nstep: 1}\n")
    (tmp_path / "c.json").write_text('{"base": "sub/b.yaml", "exp_name": "c"}')
    raw, _ = load_config(tmp_path / "c.json")
    assert raw == {"env": {"env_id": "CartPole-v1"}, "policy": {"nstep": 1}, "exp_name": "c"}
    (tmp_path / "a.yaml").write_text("base: c.json\n")
    with pytest.raises(ConfigError, match="circle"):
        load_config(tmp_path / "c.json")
    (tmp_path / "d.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "d.yaml")


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples" / "tuning").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_tuning_example_is_a_valid_tuning(path):
    from jobconfig.tuning import plan_tuning

    raw, _ = load_config(path)
    tuning, base = plan_tuning(raw)
    assert tuning.params and "tune" not in base
    resolve_job_config(base)
