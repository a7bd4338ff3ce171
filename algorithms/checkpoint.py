"""Checkpoint state of a learner that trains one model with one optimizer (PPO and
IMPALA): what it saves to resume, and how it takes a published policy's weights."""

from __future__ import annotations

import numpy as np
import torch

from algorithms.sync import LOCAL, GradientSync
from common.models import load_numpy_state


class OneModelState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_iter: int
    #: Averages gradients across the ranks of a learner group (LOCAL: none).
    sync: GradientSync = LOCAL

    def state_dict(self) -> dict:
        return {
            "online": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_iter": self.train_iter,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.train_iter = int(state["train_iter"])

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.model, tensors)
