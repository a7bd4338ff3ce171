"""Every example config resolves, fits its env and is taken by its workflow: what a
user copies runs, or says why before anything starts."""

import importlib.util
from pathlib import Path

import pytest

from jobconfig import fit_to_env, load_config, resolve_job_config
from services.coordinator.workflows import check_workflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
    (ROOT / "examples" / "di_engine").glob("*.py")
)
#: What an example's env needs installed (the dev install has all of them).
NEEDS = {"pong": "ale_py", "halfcheetah": "mujoco", "minigrid": "minigrid"}


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
