"""Checkpoint state of a learner: one model with one optimizer (PPO, IMPALA), or an
online network with a target network (DQN, R2D2): what it saves to resume, and how it
takes a published policy's weights."""

from __future__ import annotations

import numpy as np
import torch
from torch.optim import Optimizer

from algorithms.step import load_optimizer_state
from algorithms.sync import LOCAL, GradientSync
from common.models import load_numpy_state


class OneModelState:
    model: torch.nn.Module
    optimizer: Optimizer
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
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.train_iter = int(state["train_iter"])

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.model, tensors)


class TargetNetworkState:
    """An online network trained with one optimizer, and a target network that follows
    it (a hard copy every so many updates, or Polyak averaging)."""

    online: torch.nn.Module
    target: torch.nn.Module
    optimizer: Optimizer
    train_iter: int
    sync: GradientSync = LOCAL

    def update_target(self, theta: float | None, every_iters: int) -> None:
        """After an update: move the target `theta` of the way to the online network,
        or (theta None) copy it whole every `every_iters` updates."""
        if theta is not None:
            with torch.no_grad():
                for t, o in zip(self.target.parameters(), self.online.parameters(), strict=True):
                    t.lerp_(o, theta)
        elif self.train_iter % every_iters == 0:
            self.target.load_state_dict(self.online.state_dict())

    def state_dict(self) -> dict:
        """Everything to resume: networks, optimizer, counter (weights_only-loadable)."""
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_iter": self.train_iter,
        }

    def load_state_dict(self, state: dict) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.train_iter = int(state["train_iter"])

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        """A published version's weights; the target network restarts from them."""
        load_numpy_state(self.online, tensors)
        self.target.load_state_dict(self.online.state_dict())
