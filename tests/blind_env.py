"""An env with no render mode at all, registered by importing this module: what an
evaluation video and `drover enjoy` meet when an env cannot show itself."""

import gymnasium as gym
import numpy as np

ENV_ID = "DroverBlind-v0"


class Blind(gym.Env):
    metadata = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, True, False, {}


if ENV_ID not in gym.envs.registry:
    gym.register(id=ENV_ID, entry_point=Blind)
