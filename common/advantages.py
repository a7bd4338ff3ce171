"""Advantage estimates shared by the collectors (which compute them) and learners."""

from __future__ import annotations

import numpy as np

#: The round column of each env's discounted return so far (`DiscountedReturns`).
DISCOUNTED_RETURN = "discounted_return"


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    ended: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates over [T, num_envs] arrays.

    Args:
        next_values: V of the state after each step (the true last state at an
            episode's end, so a time-limit truncation bootstraps from it).
        terminated: the episode ended in a terminal state (no bootstrap).
        ended: the episode ended for any reason (the recursion stops there).

    Returns:
        (advantages, returns = advantages + values), both [T, num_envs].
    """
    delta = rewards + gamma * next_values * (1.0 - terminated) - values
    adv = np.zeros_like(delta)
    running = np.zeros(delta.shape[1:], dtype=delta.dtype)
    for t in range(len(delta) - 1, -1, -1):
        running = delta[t] + gamma * lam * (1.0 - ended[t]) * running
        adv[t] = running
    return adv, adv + values


class DiscountedReturns:
    """Each env's discounted return so far in its episode, from the rewards as the env
    gave them: what reward normalization (PPO's `policy.normalize.reward`) keeps the
    running spread of, and divides rewards by.

    Usage::

        returns = DiscountedReturns(num_envs, gamma)
        column = returns.step(step.reward, step.ended)   # then 0 where an episode ended
    """

    def __init__(self, num_envs: int, gamma: float) -> None:
        self.gamma = gamma
        self.value = np.zeros(num_envs, np.float64)

    def step(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        self.value = self.value * self.gamma + reward
        out = self.value.astype(np.float32)
        self.value[np.asarray(ended, bool)] = 0.0
        return out
