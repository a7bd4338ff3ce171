"""An env with a Dict observation, registered by importing this module (tests name it
in DROVER_ENV_MODULES, as an operator would name their env package): CartPole whose
observation is split into the cart's and the pole's parts, plus a Discrete one."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "DroverDictCartPole-v0"


class DictCartPole(gym.Wrapper):
    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        part = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {"cart": part, "pole": part, "leaning_right": gym.spaces.Discrete(2)}
        )

    def _split(self, obs: np.ndarray) -> dict:
        return {"cart": obs[:2], "pole": obs[2:], "leaning_right": int(obs[2] > 0)}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._split(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._split(obs), reward, terminated, truncated, info


if ENV_ID not in gym.envs.registry:
    gym.register(id=ENV_ID, entry_point=DictCartPole, max_episode_steps=500)
