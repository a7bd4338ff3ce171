"""How a collector loop acts and steps its envs: in turn, or double-buffered.

A step is two kinds of work: the policy's network on the observations (torch, on the
main thread) and the envs' simulation. In turn, each waits for the other. Double
buffering (Sample Factory's "double-buffered sampling") splits the envs into two
halves: while one half's envs step on a thread, the policy acts on the other half's
observations, so the network and the simulation run at the same time on different
cores. Every env still gets an action computed from its own current observation.

Usage (a collector loop)::

    stepper = make_stepper(config.env, num_envs)   # Sequential or DoubleBuffered
    stepper.reset(seed)
    while ...:
        def act(obs):                              # obs -> (env actions, recorded)
            actions = policy.act(obs, rng, steps)
            return policy.env_action(actions), (actions,)
        obs, (actions,), step = stepper.step_with(act)
    stepper.close()

`obs` is what each env observed when it acted, `step` what followed, both in env
order. With double buffering, one half's next step is already under way when
`step_with` returns: its action came from the policy as it was then (a newer version
loaded meanwhile acts from the following step on).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from common.config import EnvConfig
from common.envs import VectorEnvAdapter, VectorStep, make_env, usable_cpus

#: What the policy gives for a batch of observations: the env's actions, and the
#: arrays the loop records for each env (the action as recorded, log-probabilities).
Act = Callable[[np.ndarray], tuple[np.ndarray, tuple[np.ndarray, ...]]]

#: Managers whose stepping leaves the GIL free (C++ threads, worker processes), so a
#: thread can step them while torch acts; in-process gymnasium envs mostly hold it.
OVERLAPPING_MANAGERS = frozenset({"envpool", "async"})
#: Bound on waiting for one half's step (a dead env worker fails sooner on its own).
STEP_WAIT_S = 300.0


class Stepper(Protocol):
    num_envs: int
    #: Each env's current observation (what it will act on next).
    obs: np.ndarray

    def reset(self, seed: int) -> np.ndarray: ...

    def step_with(self, act: Act) -> tuple[np.ndarray, tuple[np.ndarray, ...], VectorStep]: ...

    def close(self) -> None: ...


def double_buffered(config: EnvConfig, num_envs: int) -> bool:
    """Whether a collector with `num_envs` envs double-buffers: when `env.double_buffer`
    says so and it has at least 2 envs.

    Off by default: on 2 CPU cores the policy's CNN and the envs already fill both
    cores, and double buffering measured no faster (bench/atari_collect.py); it pays
    where acting and stepping use different resources (a GPU policy, more cores)."""
    return bool(config.double_buffer) and num_envs >= 2


def make_stepper(config: EnvConfig, num_envs: int) -> Stepper:
    """The training envs of a collector task, stepped as `double_buffered` says."""
    if not double_buffered(config, num_envs):
        return Sequential(make_env(config, num_envs))
    if config.num_workers is None:
        # The halves share the CPUs: each steps on half of them.
        config = dataclasses.replace(config, num_workers=max(1, usable_cpus() // 2))
    first = num_envs // 2
    half_a = make_env(config, first)
    try:
        half_b = make_env(config, num_envs - first)
    except BaseException:
        half_a.close()
        raise
    return DoubleBuffered(half_a, half_b)


class Sequential:
    """Act on every env, then step every env."""

    def __init__(self, env: VectorEnvAdapter) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.obs = np.empty(0)

    def reset(self, seed: int) -> np.ndarray:
        self.obs = self.env.reset(seed=seed)
        return self.obs

    def step_with(self, act: Act) -> tuple[np.ndarray, tuple[np.ndarray, ...], VectorStep]:
        obs = self.obs
        env_actions, recorded = act(obs)
        step = self.env.step(env_actions)
        self.obs = step.obs
        return obs, recorded, step

    def close(self) -> None:
        self.env.close()


class DoubleBuffered:
    """Two halves of the envs (envs 0..k-1 and k..n-1), each stepping on a thread
    while the policy acts on the other's observations."""

    def __init__(self, half_a: VectorEnvAdapter, half_b: VectorEnvAdapter) -> None:
        self.halves = (half_a, half_b)
        self.num_envs = half_a.num_envs + half_b.num_envs
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="env-step")
        self._obs: list[np.ndarray] = []
        #: Half A's step under way: the obs it acted on, what was recorded, the step.
        self._pending: tuple[np.ndarray, tuple[np.ndarray, ...], Future[VectorStep]] | None = None

    @property
    def obs(self) -> np.ndarray:
        return np.concatenate(self._obs)

    def reset(self, seed: int) -> np.ndarray:
        self._wait_pending()
        half_a, half_b = self.halves
        # Env i gets seed + i, as in one vector of all the envs.
        self._obs = [half_a.reset(seed=seed), half_b.reset(seed=seed + half_a.num_envs)]
        return self.obs

    def step_with(self, act: Act) -> tuple[np.ndarray, tuple[np.ndarray, ...], VectorStep]:
        half_a, half_b = self.halves
        if self._pending is None:
            self._pending = self._launch(half_a, self._obs[0], act)
        obs_b = self._obs[1]
        env_actions_b, recorded_b = act(obs_b)  # while half A steps
        stepping_b = self._pool.submit(half_b.step, env_actions_b)
        obs_a, recorded_a, stepping_a = self._pending
        self._pending = None
        step_a = stepping_a.result(timeout=STEP_WAIT_S)
        self._obs[0] = step_a.obs
        # A's next step starts now, while half B is still stepping.
        self._pending = self._launch(half_a, step_a.obs, act)
        step_b = stepping_b.result(timeout=STEP_WAIT_S)
        self._obs[1] = step_b.obs
        recorded = tuple(
            np.concatenate([a, b]) for a, b in zip(recorded_a, recorded_b, strict=True)
        )
        return np.concatenate([obs_a, obs_b]), recorded, _joined(step_a, step_b)

    def _launch(
        self, half: VectorEnvAdapter, obs: np.ndarray, act: Act
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...], Future[VectorStep]]:
        env_actions, recorded = act(obs)
        return obs, recorded, self._pool.submit(half.step, env_actions)

    def _wait_pending(self) -> None:
        if self._pending is not None:
            with contextlib.suppress(Exception):  # its outcome is dropped either way
                self._pending[2].result(timeout=STEP_WAIT_S)
            self._pending = None

    def close(self) -> None:
        self._wait_pending()
        self._pool.shutdown(wait=True)
        for half in self.halves:
            half.close()


def _joined(a: VectorStep, b: VectorStep) -> VectorStep:
    return VectorStep(
        obs=np.concatenate([a.obs, b.obs]),
        reward=np.concatenate([a.reward, b.reward]),
        terminated=np.concatenate([a.terminated, b.terminated]),
        truncated=np.concatenate([a.truncated, b.truncated]),
        final_obs=np.concatenate([a.final_obs, b.final_obs]),
    )
