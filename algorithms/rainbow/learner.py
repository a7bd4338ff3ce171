"""C51's and Rainbow's learner: the categorical (distributional) loss on double-DQN
n-step targets, with importance weights. Pure torch: no I/O, no HTTP.

The target distribution of a transition is the target network's distribution for
the next state's action (chosen by the online network: double DQN), its atoms moved
to `reward + discount * z` (n-step: `discount` is gamma ** steps taken, 0 when the
episode terminated) and projected back onto the support (`project`). The loss is
its cross-entropy with the online distribution of the action taken; the priorities
sent back are the KL divergence between the two (Rainbow's), which differs from the
cross-entropy by the target's entropy only.

Usage::

    learner = DistributionalDQN(policy_config, "cpu", noisy=True)   # Rainbow
    info = learner.learn_batch(columns, weights)   # info.td_abs -> new priorities
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from algorithms.dqn.learner import TransitionBatch, UpdateInfo
from algorithms.rainbow.networks import DistributionalQNetwork, noise_sigma
from algorithms.step import adam, finite_step, learning_rate, to_floats
from algorithms.sync import LOCAL, GradientSync
from common.config import PolicyConfig
from common.models import load_numpy_state


def project(
    probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """The distribution of `reward + discount * Z` on `support`, for Z distributed as
    `probs` on it ([B, n_atom]; `reward` and `discount` are [B]).

    Each moved atom is clipped to the support's ends, then split between the two
    atoms either side of it in proportion to its nearness to each (an atom landing
    on one keeps its whole mass there), so the mass of each row stays 1.
    """
    n_atom = support.numel()
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (n_atom - 1)
    moved = (reward.unsqueeze(1) + discount.unsqueeze(1) * support).clamp(v_min, v_max)
    position = (moved - v_min) / delta  # in [0, n_atom - 1]
    lower = position.floor().clamp(0, n_atom - 1)
    upper_share = position - lower
    lower_index = lower.long()
    upper_index = (lower_index + 1).clamp(max=n_atom - 1)
    projected = torch.zeros_like(probs)
    projected.scatter_add_(1, lower_index, probs * (1.0 - upper_share))
    projected.scatter_add_(1, upper_index, probs * upper_share)
    return projected


class DistributionalDQN:
    """C51 (`noisy=False`) or Rainbow (`noisy=True`: the online and target networks
    each draw new noise for every update)."""

    def __init__(
        self, config: PolicyConfig, device: str | torch.device = "cpu", *, noisy: bool
    ) -> None:
        self.config = config
        self.noisy = noisy
        self.device = torch.device(device)
        self.online = DistributionalQNetwork(config.model, noisy=noisy).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = adam(self.online.parameters(), lr=config.learn.learning_rate)
        self.train_iter = 0
        #: Averages gradients across the ranks of a learner group (LOCAL: none).
        self.sync: GradientSync = LOCAL
        #: Batches whose loss was not finite: no step was taken on them.
        self.skipped_updates = 0

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> UpdateInfo:
        """One update on a batch of segment rows (what the learner's loop calls)."""
        return self.update(TransitionBatch.from_numpy(columns, weights, self.device))

    def update(self, batch: TransitionBatch) -> UpdateInfo:
        if self.noisy:
            self.online.reset_noise()
            self.target.reset_noise()
        rows = torch.arange(len(batch.action), device=self.device)
        log_p = self.online.log_probs(batch.obs)[rows, batch.action]  # [B, n_atom]
        support = self.online.support
        with torch.no_grad():
            # Double DQN: the online net picks the next action, the target net's
            # distribution for it is the one moved and projected.
            next_action = self.online(batch.next_obs).argmax(dim=1)
            next_probs = self.target.log_probs(batch.next_obs)[rows, next_action].exp()
            discount = batch.discount * (1.0 - batch.done)
            target = project(next_probs, batch.reward, discount, support)
        cross_entropy = -(target * log_p).sum(dim=1)
        loss = (batch.weight * cross_entropy).mean()
        grad_norm = finite_step(
            loss,
            self.optimizer,
            self.online.parameters(),
            self.config.learn.max_grad_norm,
            sync=self.sync,
        )
        if grad_norm is None:
            self.skipped_updates += 1
        self.train_iter += 1
        self._update_target()
        with torch.no_grad():
            entropy = -torch.special.xlogy(target, target).sum(dim=1)
            kl = (cross_entropy.detach() - entropy).clamp(min=0.0)
            values = {
                "loss/cross_entropy": loss,
                "value/q_mean": (log_p.detach().exp() * support).sum(dim=1).mean(),
                "value/target_q_mean": (target * support).sum(dim=1).mean(),
                "value/kl_mean": kl.mean(),
            }
            if self.noisy:
                values["policy/noise_sigma"] = noise_sigma(self.online)
        scalars = to_floats(values)
        scalars["optim/grad_norm"] = math.nan if grad_norm is None else grad_norm
        scalars["optim/learning_rate"] = learning_rate(self.optimizer)
        return UpdateInfo(
            loss=scalars["loss/cross_entropy"],
            q_mean=scalars["value/q_mean"],
            td_abs=kl.cpu().numpy(),
            scalars=scalars,
        )

    def _update_target(self) -> None:
        learn = self.config.learn
        if learn.target_theta is not None:
            with torch.no_grad():
                for t, o in zip(self.target.parameters(), self.online.parameters(), strict=True):
                    t.lerp_(o, learn.target_theta)
        elif self.train_iter % learn.target_update_freq == 0:
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
        self.optimizer.load_state_dict(state["optimizer"])
        self.train_iter = int(state["train_iter"])

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        """A published version's weights; the target network restarts from them."""
        load_numpy_state(self.online, tensors)
        self.target.load_state_dict(self.online.state_dict())
