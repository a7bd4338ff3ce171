"""The `async` env manager: the same steps as `sync`, and a failing worker is an error
in the parent, never a hang or a leak."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from common.config import ConfigError, EnvConfig
from common.env_guard import setup_env_registry
from common.env_make import make_one_env
from common.env_workers import EnvWorkerError, SubprocessVector
from common.envs import GymnasiumVector, VectorStep, make_env
from tests.helpers import child_states

# Every wait below is bounded by a worker deadline; this bounds the test itself.
pytestmark = pytest.mark.timeout(60)

FIELDS = ("obs", "reward", "terminated", "truncated", "final_obs")
SHM_DIR = Path("/dev/shm")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def registry() -> None:
    setup_env_registry({})  # Atari and MiniGrid ids, as a collector registers them


def our_blocks() -> list[str]:
    """The shared memory blocks this process's vectors created and has not unlinked."""
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(f"drover_{os.getpid()}_"))


def gone(pid: int) -> bool:
    """The process has exited and been reaped (a zombie still takes signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_same_step(got: VectorStep, want: VectorStep, step: int) -> None:
    for field in FIELDS:
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype, f"step {step}: {field} is {a.dtype}, sync gives {b.dtype}"
        assert np.array_equal(a, b), f"step {step}: {field} differs from sync"


def test_cartpole_steps_as_sync_does() -> None:
    # 5 envs over 2 workers: shares of 3 and 2, so env seeds must follow the env index.
    config = EnvConfig(env_id="CartPole-v1", manager="async", num_workers=2)
    rng = np.random.default_rng(0)
    ended = 0
    with SubprocessVector(config, 5) as envs:
        sync = GymnasiumVector(config, 5)
        try:
            np.testing.assert_array_equal(envs.reset(seed=3), sync.reset(seed=3))
            for step in range(300):
                actions = rng.integers(0, 2, size=5)
                got, want = envs.step(actions), sync.step(actions)
                assert_same_step(got, want, step)
                # An ended env shows its next episode; its last observation is final_obs.
                for env in np.flatnonzero(got.ended):
                    assert not np.array_equal(got.obs[env], got.final_obs[env])
                ended += int(got.ended.sum())
        finally:
            sync.close()
    assert ended >= 10, "the comparison should cover episode ends and same-step resets"


def test_pong_steps_as_sync_does() -> None:
    # Atari's no-op reset draws from the env's np_random, seeded by reset(seed).
    config = EnvConfig(env_id="PongNoFrameskip-v4", manager="async", num_workers=2, noop_max=30)
    rng = np.random.default_rng(1)
    with SubprocessVector(config, 2) as envs:
        sync = GymnasiumVector(config, 2)
        try:
            first = envs.reset(seed=7)
            assert first.shape == (2, 4, 84, 84) and first.dtype == np.uint8
            np.testing.assert_array_equal(first, sync.reset(seed=7))
            for step in range(20):
                actions = rng.integers(0, 6, size=2)
                assert_same_step(envs.step(actions), sync.step(actions), step)
        finally:
            sync.close()


def test_a_refused_config_is_a_config_error_in_the_parent() -> None:
    config = EnvConfig(env_id="MiniGrid-Empty-5x5-v0", manager="async", num_workers=2)
    with pytest.raises(ConfigError) as in_process:
        make_one_env(config, training=True)
    before = child_states(os.getpid())
    with pytest.raises(ConfigError) as from_worker:
        SubprocessVector(config, 2)
    assert from_worker.value.field == "env.obs_key"
    assert from_worker.value.message == in_process.value.message
    # Nothing left behind by the half-made vector.
    assert our_blocks() == []
    new = {pid: state for pid, state in child_states(os.getpid()).items() if pid not in before}
    assert not new, f"workers left running or unreaped (state Z): {new}"


def test_a_killed_worker_fails_the_next_step_at_once() -> None:
    config = EnvConfig(env_id="CartPole-v1", num_workers=2)
    envs = SubprocessVector(config, 4, step_timeout_s=30)
    envs.reset(seed=0)
    os.kill(envs.pids[1], signal.SIGKILL)
    start_s = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"env worker 1 \(envs 2..3\) was killed by SIGKILL"):
        envs.step(np.zeros(4, np.int64))
    assert time.monotonic() - start_s < 5, "a dead worker must not wait out the step deadline"
    # The vector closed itself: workers reaped, memory freed, further use refused.
    assert all(gone(pid) for pid in envs.pids)
    assert our_blocks() == []
    with pytest.raises(EnvWorkerError, match="closed"):
        envs.step(np.zeros(4, np.int64))


def test_an_env_error_in_a_worker_reaches_the_parent() -> None:
    envs = SubprocessVector(EnvConfig(num_workers=2), 2)
    envs.reset(seed=0)
    # CartPole asserts that its action is 0 or 1; the worker sends the assertion back.
    with pytest.raises(EnvWorkerError, match=r"worker 1 .* stepping: AssertionError: .*invalid"):
        envs.step(np.array([0, 5]))
    assert all(gone(pid) for pid in envs.pids)
    assert our_blocks() == []


def test_a_stalled_worker_fails_the_step_at_its_deadline() -> None:
    envs = SubprocessVector(EnvConfig(num_workers=2), 2, step_timeout_s=0.5)
    envs.reset(seed=0)
    os.kill(envs.pids[0], signal.SIGSTOP)
    start_s = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"env worker 0 \(envs 0..0\) did not finish stepping"):
        envs.step(np.zeros(2, np.int64))
    assert time.monotonic() - start_s < 5
    assert all(gone(pid) for pid in envs.pids)  # killed although stopped, and reaped
    assert our_blocks() == []


def test_close_frees_the_workers_and_the_shared_memory() -> None:
    envs = SubprocessVector(EnvConfig(num_workers=2), 3)
    assert len(envs.pids) == 2
    assert len(our_blocks()) == 6  # actions, obs, final_obs, reward, terminated, truncated
    envs.reset(seed=0)
    with pytest.raises(ValueError, match="expected \\[3\\]"):
        envs.step(np.zeros(2, np.int64))
    envs.step(np.ones(3, np.int64))  # a refused call leaves the vector usable
    envs.close()
    assert our_blocks() == []
    assert all(gone(pid) for pid in envs.pids)
    envs.close()  # idempotent
    with pytest.raises(EnvWorkerError, match="closed"):
        envs.reset(seed=0)


def test_workers_exit_when_their_parent_dies() -> None:
    parent = textwrap.dedent(
        """
        import os, sys
        from common.config import EnvConfig
        from common.env_workers import SubprocessVector
        envs = SubprocessVector(EnvConfig(num_workers=2), 2)
        print(*envs.pids, flush=True)
        os._exit(0)  # no close: the workers see their stdin end
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", parent], cwd=REPO_ROOT, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stderr.decode()
    pids = [int(pid) for pid in result.stdout.split()]
    assert len(pids) == 2
    alive = [pid for pid in pids if not exits_within(pid, timeout_s=10)]
    assert not alive, f"orphaned workers {alive} still run 10 s after their parent died"


def exits_within(pid: int, timeout_s: float) -> bool:
    """Whether the process (not necessarily our child) exits within the time: a pidfd
    becomes readable when its process exits."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], timeout_s)[0])
    finally:
        os.close(pidfd)


def test_make_env_gives_async_envs() -> None:
    envs = make_env(EnvConfig(env_id="CartPole-v1", manager="async", num_workers=2), 4)
    try:
        assert isinstance(envs, SubprocessVector) and envs.num_envs == 4
        assert envs.reset(seed=0).shape == (4, 4)
        step = envs.step(np.zeros(4, np.int64))
        assert step.obs.shape == (4, 4) and step.reward.shape == (4,)
    finally:
        envs.close()


def test_the_worker_imports_no_torch() -> None:
    check = (
        "import sys, common.env_workers, common.env_guard as guard; guard.setup_env_registry(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO_ROOT, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "[]"
