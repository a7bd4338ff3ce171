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

import math

import torch

from algorithms.dqn.learner import DQN, TransitionBatch, UpdateInfo
from algorithms.rainbow.networks import DistributionalQNetwork, noise_sigma
from algorithms.step import finite_step, learning_rate, to_floats
from common.config import PolicyConfig


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


class DistributionalDQN(DQN):
    """C51 (`noisy=False`) or Rainbow (`noisy=True`: the online and target networks
    each draw new noise for every update): DQN's learner (target network, its update,
    checkpoints, policy loading) with a distributional head and loss."""

    def __init__(
        self, config: PolicyConfig, device: str | torch.device = "cpu", *, noisy: bool
    ) -> None:
        self.noisy = noisy
        super().__init__(config, device)

    def make_network(self, config: PolicyConfig) -> DistributionalQNetwork:
        return DistributionalQNetwork(config.model, noisy=self.noisy)

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
