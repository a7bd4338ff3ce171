"""Env ids and kwargs from a job config name registered envs, never code to import."""

import importlib.util
import subprocess
import sys
import textwrap
import uuid

import gymnasium as gym
import numpy as np
import pytest

from common.config import ConfigError, EnvConfig
from common.env_guard import (
    ENV_MODULES_VAR,
    check_env,
    env_modules_from_env,
    registered_spec,
    setup_env_registry,
)
from common.envs import env_spaces, make_vector_env
from common.settings import SettingsError

FLAT_ENV_MODULE = """
import gymnasium as gym
import numpy as np


class FlatEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, size=3):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), 0.0, True, False, {}
"""


def env(env_id: str = "CartPole-v1", **env_kwargs) -> EnvConfig:
    return EnvConfig(env_id=env_id, env_kwargs=env_kwargs)


def refused(config: EnvConfig, *, checked: bool = True) -> ConfigError:
    """The error each entry point gives, the same from all; `checked=False` for what only
    making the env can find."""
    attempts = [env_spaces, lambda c: make_vector_env(c, 2)]
    if checked:
        attempts.append(check_env)
    errors = []
    for attempt in attempts:
        with pytest.raises(ConfigError) as err:
            attempt(config)
        errors.append(err.value)
    assert len({(e.field, e.message) for e in errors}) == 1, errors
    return errors[0]


@pytest.fixture
def unique_module_name():
    """A module name no other test uses; forgotten by the import system afterwards."""
    name = f"drover_test_envs_{uuid.uuid4().hex[:12]}"
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def registered():
    """Register envs under ids for one test only: yields `register(id, entry_point)`."""
    ids: list[str] = []

    def register(env_id: str, entry_point: str) -> str:
        gym.register(id=env_id, entry_point=entry_point)
        ids.append(env_id)
        return env_id

    yield register
    for env_id in ids:
        gym.envs.registry.pop(env_id, None)


# --- env ids that name code -----------------------------------------------------------


@pytest.mark.parametrize("env_id", ["this:Foo", "os:system", "a:b:c", "gymnasium:CartPole-v1"])
def test_ids_that_name_a_module_are_refused(env_id):
    err = refused(env(env_id))
    assert err.field == "env.env_id"
    assert "names a module" in err.message


def test_a_planted_module_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported.txt"
    (tmp_path / "plantedmod.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nclass Env: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "plantedmod", raising=False)

    err = refused(env("plantedmod:Env"))

    assert err.field == "env.env_id"
    assert not marker.exists()
    assert "plantedmod" not in sys.modules


@pytest.mark.parametrize("env_id", ["", "Cart Pole-v1", "../CartPole-v1", "x" * 500])
def test_ids_outside_gymnasium_grammar_are_refused(env_id):
    assert refused(env(env_id)).field == "env.env_id"


def test_an_unknown_id_gets_a_did_you_mean():
    err = refused(env("CartPol-v1"))
    assert err.field == "env.env_id"
    assert "did you mean 'CartPole-v1'" in err.message


def test_an_unversioned_id_is_not_silently_upgraded():
    err = refused(env("CartPole"))
    assert err.field == "env.env_id"
    assert "CartPole-v" in err.message


def test_a_registered_env_missing_its_package_is_a_config_error(registered):
    env_id = registered(
        f"DroverTestNoDeps{uuid.uuid4().hex[:8]}-v0", "drover_no_such_module_xyz:Env"
    )
    err = refused(env(env_id))
    assert err.field == "env.env_id"
    assert "not installed: drover_no_such_module_xyz" in err.message


def test_gymnasiums_jax_envs_are_a_config_error_without_jax():
    if importlib.util.find_spec("jax") is not None:
        pytest.skip("jax is installed here")
    err = refused(env("phys2d/CartPole-v1"))
    assert err.field == "env.env_id"
    assert "not installed: jax" in err.message


# --- env kwargs ------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, -1, "10", 10.0, True, 10**9])
def test_max_episode_steps_must_be_a_positive_bounded_int(steps):
    err = refused(env(max_episode_steps=steps))
    assert err.field == "env.env_kwargs.max_episode_steps"


@pytest.mark.parametrize("mode", [5, "nonsense", ["rgb_array"]])
def test_render_mode_must_be_one_the_env_has(mode):
    assert refused(env(render_mode=mode)).field == "env.env_kwargs.render_mode"


def test_disable_env_checker_must_be_a_bool():
    assert refused(env(disable_env_checker="no")).field == "env.env_kwargs.disable_env_checker"


def test_an_unknown_kwarg_is_refused_by_name():
    err = refused(env(foo=1))
    assert err.field == "env.env_kwargs.foo"
    assert "sutton_barto_reward" in err.message  # says what CartPole takes


@pytest.mark.parametrize("name", ["num_envs", "wrappers", "vector_kwargs", "id"])
def test_kwargs_that_make_binds_itself_are_refused(name):
    assert refused(env(**{name: 1})).field == f"env.env_kwargs.{name}"


def test_kwarg_values_must_be_shallow_json():
    assert refused(env(sutton_barto_reward=object())).field == (
        "env.env_kwargs.sutton_barto_reward"
    )
    deep = [[[[[1]]]]]
    assert refused(env(sutton_barto_reward=deep)).field == "env.env_kwargs.sutton_barto_reward"


def test_a_wrong_kwarg_value_the_env_rejects_is_a_config_error(
    tmp_path, monkeypatch, registered, unique_module_name
):
    (tmp_path / f"{unique_module_name}.py").write_text(FLAT_ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    env_id = registered(f"DroverTestFlat{uuid.uuid4().hex[:8]}-v0", f"{unique_module_name}:FlatEnv")
    config = env(env_id, size="big")
    check_env(config)  # a keyword the constructor takes; only making the env finds the rest
    err = refused(config, checked=False)  # the constructor raises TypeError
    assert err.field == "env.env_kwargs"
    assert "refused these kwargs" in err.message


def test_valid_kwargs_still_make_the_env():
    config = env(max_episode_steps=200, render_mode=None, disable_env_checker=True)
    check_env(config)
    spaces = env_spaces(config)
    assert (spaces.obs_shape, spaces.action_shape, spaces.action_space) == ((4,), 2, "discrete")
    vector = make_vector_env(config, 2)
    try:
        assert vector.num_envs == 2
        assert vector.single_observation_space.shape == (4,)
    finally:
        vector.close()


def test_a_constructor_kwarg_is_accepted():
    check_env(env(sutton_barto_reward=True, render_mode="rgb_array"))


# --- the operator's env modules --------------------------------------------------------


def test_the_builtin_env_packages_are_there_without_being_listed():
    assert env_modules_from_env({}) == ()
    assert setup_env_registry({}) == ()
    assert registered_spec("PongNoFrameskip-v4") is not None
    assert registered_spec("MiniGrid-Empty-5x5-v0") is not None
    assert registered_spec("NoSuchEnv-v0") is None
    assert env_modules_from_env({ENV_MODULES_VAR: " ale_py, minigrid ,"}) == ("ale_py", "minigrid")


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_builtin_env_packages_are_imported_only_for_an_env_of_theirs():
    """A process whose jobs run gymnasium's own envs never loads Atari or MiniGrid; the
    first id of theirs imports them."""
    code = """if True:
        import sys
        from common.config import EnvConfig
        from common.env_guard import check_env, setup_env_registry
        setup_env_registry({})
        check_env(EnvConfig(env_id="CartPole-v1"))
        print(sorted(m for m in ("ale_py", "minigrid") if m in sys.modules))
        check_env(EnvConfig(env_id="ALE/Pong-v5"))
        print(sorted(m for m in ("ale_py", "minigrid") if m in sys.modules))
    """
    assert run_python(code).splitlines() == ["[]", "['ale_py', 'minigrid']"]


def test_an_operator_module_makes_its_envs_valid(tmp_path, monkeypatch, unique_module_name):
    env_id = f"DroverTestOperator{uuid.uuid4().hex[:8]}-v0"
    (tmp_path / f"{unique_module_name}.py").write_text(
        FLAT_ENV_MODULE
        + textwrap.dedent(f"""
            gym.register(id={env_id!r}, entry_point={unique_module_name + ":FlatEnv"!r})
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert refused(env(env_id)).field == "env.env_id"  # not registered yet

        environ = {ENV_MODULES_VAR: unique_module_name}
        expected = (unique_module_name,)
        assert setup_env_registry(environ) == expected
        assert setup_env_registry(environ) == expected  # idempotent

        spaces = env_spaces(env(env_id, size=5))
        assert (spaces.obs_shape, spaces.action_shape) == ((5,), 2)
    finally:
        gym.envs.registry.pop(env_id, None)


@pytest.mark.parametrize(
    "value", ["drover_no_such_module_xyz", "os, drover_no_such_module_xyz", "../evil", "a:b"]
)
def test_a_bad_operator_module_is_a_startup_error(value):
    with pytest.raises(SettingsError) as err:
        setup_env_registry({ENV_MODULES_VAR: value})
    assert ENV_MODULES_VAR in str(err.value)
    assert value.split(",")[-1].strip() in str(err.value)


def test_an_operator_module_that_fails_on_import_is_a_startup_error(
    tmp_path, monkeypatch, unique_module_name
):
    (tmp_path / f"{unique_module_name}.py").write_text("raise RuntimeError('broken package')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SettingsError) as err:
        setup_env_registry({ENV_MODULES_VAR: unique_module_name})
    assert ENV_MODULES_VAR in str(err.value)
    assert "broken package" in str(err.value)


def test_the_gymnasium_adapter_reports_final_and_next_observations():
    from common.envs import make_env

    config = EnvConfig(env_id="CartPole-v1", env_kwargs={"max_episode_steps": 3})
    envs = make_env(config, 2)
    try:
        obs = envs.reset(seed=0)
        assert obs.shape == (2, 4) and envs.num_envs == 2
        for _ in range(2):
            step = envs.step(np.zeros(2, dtype=np.int64))
            assert not step.ended.any() and (step.final_obs == step.obs).all()
        step = envs.step(np.zeros(2, dtype=np.int64))  # the 3rd step truncates both
        assert step.truncated.all() and step.ended.all()
        # the next episode's first observation, and the one this episode ended with
        assert not np.allclose(step.final_obs, step.obs)
        assert np.abs(step.obs).max() <= 0.05  # CartPole resets near 0
    finally:
        envs.close()


class CountingEnvs:
    """A vector env that is not gymnasium's: obs are step counts."""

    def __init__(self, num_envs):
        self.num_envs, self.t = num_envs, 0

    def reset(self, seed):
        self.t = 0
        return np.zeros((self.num_envs, 3), dtype=np.float32)

    def step(self, actions):
        from common.envs import VectorStep

        self.t += 1
        obs = np.full((self.num_envs, 3), self.t, dtype=np.float32)
        done = np.zeros(self.num_envs, dtype=bool)
        return VectorStep(obs, np.ones(self.num_envs), done, done, obs)

    def close(self):
        pass


class CountingAdapter:
    def spaces(self, config):
        from common.env_make import Spaces

        return Spaces(obs_shape=(3,), action_shape=2, action_space="discrete")

    def make(self, config, num_envs, *, training=True):
        return CountingEnvs(num_envs)


def test_an_adapter_registered_by_name_reports_spaces_and_makes_the_envs(monkeypatch):
    from common import envs

    monkeypatch.setitem(envs.ENV_ADAPTERS, "counting", CountingAdapter())
    config = EnvConfig(env_id="not-in-gymnasium", adapter="counting")
    assert envs.env_spaces(config).obs_shape == (3,)
    made = envs.make_env(config, 4)
    made.reset(seed=0)
    assert made.step(np.zeros(4)).obs.shape == (4, 3)


def test_an_unknown_adapter_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as err:
        env_spaces(EnvConfig(adapter="unknown"))
    assert err.value.field == "env.adapter" and "gymnasium" in err.value.message


def test_the_envpool_manager_without_envpool_installed_is_refused_at_submission(monkeypatch):
    import sys

    setup_env_registry({})
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` fails
    monkeypatch.delitem(sys.modules, "common.envpool_vector", raising=False)
    with pytest.raises(ConfigError) as err:
        env_spaces(EnvConfig(env_id="PongNoFrameskip-v4", manager="envpool"))
    assert err.value.field == "env.manager" and "drover[envpool]" in err.value.message


def test_an_env_envpool_cannot_step_is_refused_at_submission():
    with pytest.raises(ConfigError) as err:
        env_spaces(EnvConfig(env_id="CartPole-v1", manager="envpool"))
    assert err.value.field == "env.manager" and "sync" in err.value.message
