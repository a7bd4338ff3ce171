"""PPO: clipped surrogate objective, value loss, entropy bonus, advantage
normalization, minibatch epochs; discrete or Gaussian actions. Pure torch.

Advantages (GAE, common/advantages.py) come with the data: in the sync workflow the
collectors act with exactly the version being trained, so they compute GAE with its
critic at the end of each round, as the learner would.

Usage::

    ppo = PPO(policy_config, device="cpu")
    info = ppo.train_round(columns)      # epoch_per_collect passes over one round
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from algorithms.checkpoint import OneModelState
from algorithms.ppo import DISCOUNTED_RETURN, ROUND_ROWS
from algorithms.ppo.networks import ActorCritic, Shape
from algorithms.step import adam, device_step, learning_rate, to_device, to_floats
from common.columns import job_columns
from common.config import PolicyConfig


@dataclass(frozen=True)
class RoundInfo:
    loss: float
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    updates: int
    #: TensorBoard tags, each averaged over the round's minibatch updates
    #: (algorithms.base.RoundReport).
    scalars: dict[str, float]


class PPO(OneModelState):
    def __init__(self, config: PolicyConfig, device: str | torch.device = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.model = ActorCritic(config.model, Shape.of(config)).to(self.device)
        self.optimizer = adam(self.model.parameters(), lr=config.learn.learning_rate, eps=1e-5)
        self.train_iter = 0  # minibatch updates so far
        self.online = self.model  # what a policy version publishes
        #: What it trains on: a game's legal-action masks too.
        self.column_names = tuple(c.name for c in job_columns(ROUND_ROWS, config))
        #: Minibatches whose loss was not finite: no step was taken on them.
        self.skipped_updates = 0

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = self.loss_terms(batch)
        return loss, to_floats(stats)

    def loss_terms(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss, and its statistics as tensors still on the device."""
        learn = self.config.learn
        dist, value = self.model.distribution_and_value(batch["obs"], batch.get("action_mask"))
        logp = self.model.log_prob(dist, batch["action"])
        ratio = (logp - batch["logp"]).exp()
        adv = batch["adv"]
        if learn.adv_norm:
            # Over the global minibatch: all ranks' shares of it in a learner group.
            adv = self.sync.normalize(adv)
        surrogate = torch.min(
            ratio * adv, ratio.clamp(1 - learn.clip_ratio, 1 + learn.clip_ratio) * adv
        )
        policy_loss = -surrogate.mean()
        value_loss = 0.5 * (value - batch["ret"]).pow(2).mean()
        entropy = self.model.entropy(dist).mean()
        loss = policy_loss + learn.value_weight * value_loss - learn.entropy_weight * entropy
        with torch.no_grad():
            stats = {
                "loss/total": loss.detach(),
                "loss/policy": policy_loss.detach(),
                "loss/value": value_loss.detach(),
                "policy/entropy": entropy.detach(),
                "policy/approx_kl": ((ratio - 1) - (logp - batch["logp"])).mean(),
                "policy/clip_fraction": ((ratio - 1).abs() > learn.clip_ratio).float().mean(),
                "value/v_mean": value.mean().detach(),
                "value/return_mean": batch["ret"].mean(),
            }
        return loss, stats

    def train_round(self, columns: dict[str, np.ndarray], seed: int | None = None) -> RoundInfo:
        """`epoch_per_collect` passes of shuffled minibatches over one round's data."""
        learn = self.config.learn
        data = {
            k: to_device(columns[k], self.device)
            for k in self.column_names
            if k != DISCOUNTED_RETURN
        }
        n = len(data["obs"])
        generator = torch.Generator().manual_seed(seed if seed is not None else self.train_iter)
        totals: dict[str, float] = {}
        norms: list[float] = []
        updates = 0
        for _ in range(learn.epoch_per_collect):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, learn.batch_size):
                index = order[start : start + learn.batch_size].to(self.device)
                loss, terms = self.loss_terms({k: v[index] for k, v in data.items()})
                parameters = self.model.parameters()
                terms["optim/grad_norm"] = device_step(
                    loss, self.optimizer, parameters, learn.max_grad_norm, sync=self.sync
                )
                stats = to_floats(terms)  # the update's one read from the device
                grad_norm = stats.pop("optim/grad_norm")
                if math.isnan(grad_norm):  # not stepped on
                    self.skipped_updates += 1
                else:
                    norms.append(grad_norm)
                self.train_iter += 1
                updates += 1
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + value
        scalars = {k: v / max(updates, 1) for k, v in totals.items()}
        scalars["optim/grad_norm"] = sum(norms) / len(norms) if norms else math.nan
        scalars["optim/learning_rate"] = learning_rate(self.optimizer)
        scalars |= self._update_statistics(data["obs"], columns)
        return RoundInfo(
            loss=scalars["loss/total"],
            policy_loss=scalars["loss/policy"],
            value_loss=scalars["loss/value"],
            entropy=scalars["policy/entropy"],
            approx_kl=scalars["policy/approx_kl"],
            clip_fraction=scalars["policy/clip_fraction"],
            updates=updates,
            scalars=scalars,
        )

    def _update_statistics(
        self, obs: torch.Tensor, columns: dict[str, np.ndarray]
    ) -> dict[str, float]:
        """After the round's updates: its observations and discounted returns into the
        running statistics (`policy.normalize`) that the next version acts with, so
        that the round was collected and trained on with the same ones."""
        scalars: dict[str, float] = {}
        obs_norm, return_norm = self.model.obs_norm, self.model.return_norm
        if obs_norm is not None:
            obs_norm.update(obs, self.sync)
            scalars["normalize/obs_std_mean"] = float(obs_norm.var.sqrt().mean())
        if return_norm is not None:
            return_norm.update(torch.as_tensor(columns[DISCOUNTED_RETURN]), self.sync)
            scalars["normalize/return_std"] = float(return_norm.var.sqrt())
        return scalars
