"""R2D2's network: an observation encoder (an MLP for vectors, a CNN for images), an
LSTM over time and a Q head, optionally dueling.

The same module acts (one step a call, `step`) and learns (whole sequences,
`forward`): both run the one `nn.LSTM`, so the state an actor records is the state
the learner would have computed from the same observations.
"""

from __future__ import annotations

import torch
from torch import nn

from algorithms.r2d2.config import R2D2ModelConfig
from common.models import make_encoder

#: An LSTM's state: (h, c), each [batch, lstm_hidden_size].
LSTMState = tuple[torch.Tensor, torch.Tensor]


class RecurrentQNetwork(nn.Module):
    """Q-values of each action from the encoder's features of the observations so far:
    encoder -> LSTM -> Q head (V + A - mean A when dueling)."""

    def __init__(self, config: R2D2ModelConfig) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        self.encoder = make_encoder(config)
        self.hidden_size: int = config.lstm_hidden_size
        self.lstm = nn.LSTM(self.encoder.out_features, self.hidden_size, batch_first=True)
        self.dueling = config.dueling
        if self.dueling:
            self.advantage = nn.Linear(self.hidden_size, config.action_shape)
            self.value = nn.Linear(self.hidden_size, 1)
        else:
            self.head = nn.Linear(self.hidden_size, config.action_shape)

    def initial_state(self, batch: int, device: torch.device | None = None) -> LSTMState:
        """The state an episode starts from: zeros."""
        zeros = torch.zeros(batch, self.hidden_size, device=device)
        return zeros, zeros.clone()

    def forward(self, obs: torch.Tensor, state: LSTMState) -> tuple[torch.Tensor, LSTMState]:
        """Q-values along sequences.

        Args:
            obs: [B, T, *obs_shape] observations.
            state: (h0, c0), each [B, H]: the state before `obs[:, 0]`.

        Returns:
            q [B, T, actions], and the state after `obs[:, -1]`.
        """
        batch, steps = obs.shape[:2]
        features = self.encoder(obs.flatten(0, 1)).unflatten(0, (batch, steps))
        h0, c0 = state
        out, (h, c) = self.lstm(features, (h0.unsqueeze(0), c0.unsqueeze(0)))
        return self._q(out), (h.squeeze(0), c.squeeze(0))

    def step(self, obs: torch.Tensor, state: LSTMState) -> tuple[torch.Tensor, LSTMState]:
        """One step for a batch of envs: obs [B, *obs_shape] -> q [B, actions] and the
        state after it."""
        q, state = self(obs.unsqueeze(1), state)
        return q.squeeze(1), state

    def _q(self, out: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.head(out)
        advantage = self.advantage(out)
        return self.value(out) + advantage - advantage.mean(dim=-1, keepdim=True)
