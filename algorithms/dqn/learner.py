"""DQN: double DQN with a target network, dueling head option, n-step targets, Huber
loss, importance weights. Pure torch: no I/O, no HTTP.

Usage::

    dqn = DQN(policy_config, device="cpu")
    info = dqn.update(batch)          # one gradient step; info.td_abs -> new priorities
    dqn.state_dict() / dqn.load_state_dict(sd)   # checkpoints
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from algorithms.checkpoint import TargetNetworkState
from algorithms.dqn.networks import QNetwork
from algorithms.step import (
    TDReport,
    adam,
    device_step,
    td_report,
    to_device,
)
from algorithms.sync import LOCAL, GradientSync
from common.config import PolicyConfig


@dataclass(frozen=True)
class TransitionBatch:
    """n-step transitions as tensors (what each column holds: the collector's
    `NStepBuilder`, services/collector/step_data.py)."""

    obs: torch.Tensor  # [B, obs]
    action: torch.Tensor  # [B] int64
    reward: torch.Tensor  # [B] n-step discounted return
    next_obs: torch.Tensor  # [B, obs]
    done: torch.Tensor  # [B] 1.0 when the episode terminated within the n steps
    discount: torch.Tensor  # [B] gamma ** steps actually taken
    weight: torch.Tensor  # [B] importance weights (1.0 for uniform replay)

    @classmethod
    def from_numpy(
        cls, columns: dict[str, np.ndarray], weight: np.ndarray, device: torch.device
    ) -> TransitionBatch:
        def t(a: np.ndarray) -> torch.Tensor:
            return to_device(a, device)

        return cls(
            obs=t(columns["obs"]),
            action=t(columns["action"]),
            reward=t(columns["reward"]),
            next_obs=t(columns["next_obs"]),
            done=t(columns["done"]),
            discount=t(columns["discount"]),
            weight=t(weight.astype(np.float32)),
        )


#: What an update reports (per row |TD error|, for prioritized replay).
UpdateInfo = TDReport


class DQN(TargetNetworkState):
    """The learner; a variant with another head and loss (C51, Rainbow) overrides
    `make_network` and `update`, and keeps the target network, checkpoints and the
    policy loading."""

    def __init__(self, config: PolicyConfig, device: str | torch.device = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.online = self.make_network(config).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = adam(self.online.parameters(), lr=config.learn.learning_rate)
        self.train_iter = 0
        #: Averages gradients across the ranks of a learner group (LOCAL: none).
        self.sync: GradientSync = LOCAL
        #: Batches whose loss was not finite: no step was taken on them.
        self.skipped_updates = 0

    def make_network(self, config: PolicyConfig) -> torch.nn.Module:
        return QNetwork(config.model)

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> UpdateInfo:
        """One update on a batch of segment rows (what the learner's loop calls)."""
        return self.update(TransitionBatch.from_numpy(columns, weights, self.device))

    def update(self, batch: TransitionBatch) -> UpdateInfo:
        learn = self.config.learn
        q = self.online(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            # Double DQN: the online net picks the next action, the target net values it.
            next_action = self.online(batch.next_obs).argmax(dim=1, keepdim=True)
            next_q = self.target(batch.next_obs).gather(1, next_action).squeeze(1)
            target = batch.reward + batch.discount * (1.0 - batch.done) * next_q
        td = target - q
        loss = (batch.weight * F.smooth_l1_loss(q, target, reduction="none")).mean()
        parameters = self.online.parameters()
        grad_norm = device_step(
            loss, self.optimizer, parameters, learn.max_grad_norm, sync=self.sync
        )
        self.train_iter += 1
        self._update_target()
        td_abs = td.detach().abs()
        # Everything the update reports, read from the device at once.
        report, skipped = td_report(
            {
                "loss/td": loss,
                "value/q_mean": q.mean(),
                "value/target_q_mean": target.mean(),
                "value/td_abs_mean": td_abs.mean(),
                "optim/grad_norm": grad_norm,
            },
            td_abs,
            self.optimizer,
        )
        self.skipped_updates += skipped
        return report

    def _update_target(self) -> None:
        learn = self.config.learn
        self.update_target(learn.target_theta, learn.target_update_freq)
