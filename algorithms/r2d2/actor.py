"""R2D2's acting side: a recurrent Q-network that carries each env's LSTM state from
step to step, epsilon-greedy with Ape-X's fixed per-env epsilons while collecting,
greedy when evaluating.

The loop that steps the envs owns the episode boundaries: after every vector-env step
it calls `reset_state` with the envs whose episode ended, whose state goes back to
zeros. The state each env held before a step is recorded with it (`recorded`), so the
learner starts each replayed sequence from what the actor had.

Usage::

    actions = actor.act(obs, rng, job_env_steps)
    extra = actor.recorded()              # {"h": [N, H], "c": [N, H]}: before this act
    step = env.step(actor.env_action(actions))
    actor.reset_state(step.ended)
"""

from __future__ import annotations

import numpy as np
import torch

from algorithms.export import Acting, obs_port, recurrent_greedy_q
from algorithms.r2d2.config import R2D2Config
from algorithms.r2d2.networks import LSTMState, RecurrentQNetwork
from common.config import PolicyConfig
from common.models import load_numpy_state


def apex_epsilons(base: float, alpha: float, num_envs: int) -> np.ndarray:
    """Each env's epsilon (Horgan et al. 2018): env i of N explores with
    `base ** (1 + alpha * i / (N - 1))`, a single env with `base`."""
    if num_envs == 1:
        return np.array([base])
    share = np.arange(num_envs) / (num_envs - 1)
    return np.power(base, 1.0 + alpha * share)


class R2D2Policy:
    """A recurrent Q-network acting for a fixed set of envs; uniformly random until
    the first version arrives (its state is still carried from the start).

    The state is one row per env of the batch it acts on; a batch of another size
    starts every env from zeros (a new set of envs). A double-buffered collector,
    which acts on each half of its envs in turn, needs one actor per half.
    """

    def __init__(self, config: PolicyConfig) -> None:
        if not isinstance(config, R2D2Config):
            raise TypeError(f"R2D2Policy takes an R2D2Config, not {type(config).__name__}")
        assert config.model.action_shape is not None
        self.num_actions = config.model.action_shape
        self.device = torch.device(config.torch_device)
        self.network = RecurrentQNetwork(config.model).to(self.device).eval()
        self.obs = obs_port(config.model)
        self.eps_base = config.other.eps.base
        self.eps_alpha = config.other.eps.alpha
        self.version = 0
        self.loaded = False
        hidden = self.network.hidden_size
        empty = torch.zeros(0, hidden, device=self.device)
        #: Each env's state now, and before the last act (what `recorded` gives).
        self._state: LSTMState = (empty, empty)
        self._before: LSTMState = (empty, empty)

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        """Act with a published version from now on; the envs keep their states."""
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return action

    def acting(self) -> Acting:
        """One greedy step, its recurrent state in and out, as a plain network
        (algorithms/export.py)."""
        return recurrent_greedy_q(
            self.network, self.obs, self.num_actions, self.network.hidden_size
        )

    def epsilons(self, num_envs: int) -> np.ndarray:
        return apex_epsilons(self.eps_base, self.eps_alpha, num_envs)

    def act(self, obs: np.ndarray, rng: np.random.Generator, job_env_steps: int) -> np.ndarray:
        """Epsilon-greedy actions, env i with its own epsilon; the epsilons are fixed
        (no schedule), so `job_env_steps` does not change them."""
        return self._act(obs, self.epsilons(len(obs)), rng)

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Greedy actions for evaluation; the state moves on as when collecting."""
        return self._act(obs, np.zeros(len(obs)), rng)

    def exploration(self, job_env_steps: int) -> dict[str, float]:
        """The range of the envs' epsilons (of the batch last acted on)."""
        epsilons = self.epsilons(max(1, len(self._state[0])))
        return {
            "epsilon_min": round(float(epsilons.min()), 4),
            "epsilon_max": round(float(epsilons.max()), 4),
        }

    def recorded(self) -> dict[str, np.ndarray]:
        """The state each env held before the last `act` or `greedy`: the state the
        network was in when it saw that step's observation."""
        h, c = self._before
        return {"h": h.cpu().numpy(), "c": c.cpu().numpy()}

    def reset_state(self, ended: np.ndarray) -> None:
        """Zero the states of the envs whose episode ended (a bool per env, or their
        indices), so their next episode starts afresh."""
        index = np.asarray(ended)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        if len(index) == 0 or len(self._state[0]) == 0:
            return
        rows = torch.as_tensor(index, dtype=torch.long, device=self.device)
        h, c = (s.clone() for s in self._state)  # `recorded` keeps the old ones
        h[rows] = 0.0
        c[rows] = 0.0
        self._state = (h, c)

    def _act(self, obs: np.ndarray, eps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = len(obs)
        if len(self._state[0]) != n:
            self._state = self.network.initial_state(n, self.device)
        self._before = self._state
        with torch.no_grad():
            q, self._state = self.network.step(
                torch.as_tensor(obs, device=self.device), self._state
            )
        explore = rng.random(n) < eps if self.loaded else np.ones(n, dtype=bool)
        actions = rng.integers(0, self.num_actions, size=n)
        if not explore.all():
            actions = np.where(explore, actions, q.argmax(dim=1).cpu().numpy())
        return actions
