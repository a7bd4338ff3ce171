"""IMPALA: an actor-critic trained on unrolls of T steps with V-trace off-policy
correction (Espeholt et al., 2018). Pure torch.

The collectors act with whatever version they have and record the behaviour
policy's log-probabilities; V-trace corrects for the lag between that policy and the
one being trained, with importance weights clipped at `rho_clip` (for the targets'
and the policy gradient's TD errors) and `c_clip` (for how far corrections travel
back). A time-limit truncation is treated as an episode end.

Usage::

    impala = Impala(policy_config)
    info = impala.learn_batch(columns, weights)   # columns: [B, T, ...] unrolls
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from algorithms.checkpoint import OneModelState
from algorithms.impala import COLUMNS
from algorithms.ppo.networks import ActorCritic
from algorithms.step import adam, finite_step, learning_rate, to_floats
from common.config import PolicyConfig


@dataclass(frozen=True)
class VTrace:
    vs: torch.Tensor  # [B, T] value targets
    pg_advantages: torch.Tensor  # [B, T]


def vtrace(
    behaviour_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
) -> VTrace:
    """V-trace targets and policy-gradient advantages over [B, T] tensors.

    `discounts[t]` is gamma, or 0 where the episode ended after step t.
    """
    with torch.no_grad():
        rho = (target_logp - behaviour_logp).exp()
        rho_bar = rho.clamp(max=rho_clip)
        c = rho.clamp(max=c_clip)
        next_values = torch.cat([values[:, 1:], bootstrap_value.unsqueeze(1)], dim=1)
        delta = rho_bar * (rewards + discounts * next_values - values)
        correction = torch.zeros_like(bootstrap_value)
        vs_minus_v = torch.zeros_like(values)
        for t in range(values.shape[1] - 1, -1, -1):
            correction = delta[:, t] + discounts[:, t] * c[:, t] * correction
            vs_minus_v[:, t] = correction
        vs = vs_minus_v + values
        next_vs = torch.cat([vs[:, 1:], bootstrap_value.unsqueeze(1)], dim=1)
        pg_advantages = rho_bar * (rewards + discounts * next_vs - values)
    return VTrace(vs=vs, pg_advantages=pg_advantages)


@dataclass(frozen=True)
class UpdateInfo:
    loss: float
    q_mean: float  # the mean value estimate (named like DQN's for the progress report)
    td_abs: np.ndarray  # per-unroll |advantage|, unused by a fifo queue
    entropy: float
    scalars: dict[str, float]  # TensorBoard tags (algorithms.base.BatchReport)


class Impala(OneModelState):
    def __init__(self, config: PolicyConfig, device: str | torch.device = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        self.model = ActorCritic(config.model).to(self.device)
        self.online = self.model
        self.optimizer = adam(self.model.parameters(), lr=config.learn.learning_rate)
        self.train_iter = 0
        #: Batches whose loss was not finite: no step was taken on them.
        self.skipped_updates = 0

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> UpdateInfo:
        learn = self.config.learn
        t = {k: torch.as_tensor(columns[k], device=self.device) for k in COLUMNS}
        obs = t["obs"]  # [B, T, obs]
        batch, steps = obs.shape[:2]
        dist, flat_values = self.model.distribution_and_value(
            obs.reshape(batch * steps, *obs.shape[2:])
        )
        action = t["action"].reshape(batch * steps, *t["action"].shape[2:])
        target_logp = self.model.log_prob(dist, action).reshape(batch, steps)
        values = flat_values.reshape(batch, steps)
        bootstrap = self.model.value(t["bootstrap_obs"])
        discounts = self.config.discount_factor * (1.0 - t["done"])
        targets = vtrace(
            t["logp"],
            target_logp.detach(),
            t["reward"],
            discounts,
            values.detach(),
            bootstrap.detach(),
            learn.rho_clip,
            learn.c_clip,
        )
        policy_loss = -(target_logp * targets.pg_advantages).mean()
        value_loss = 0.5 * (targets.vs - values).pow(2).mean()
        entropy = self.model.entropy(dist).mean()
        loss = policy_loss + learn.value_weight * value_loss - learn.entropy_weight * entropy
        parameters = self.model.parameters()
        grad_norm = finite_step(
            loss, self.optimizer, parameters, learn.max_grad_norm, sync=self.sync
        )
        if grad_norm is None:
            self.skipped_updates += 1
        self.train_iter += 1
        with torch.no_grad():
            # How far the learner's policy has moved from the one that acted: the
            # importance ratio before V-trace clips it.
            ratio = (target_logp - t["logp"]).exp()
            scalars = to_floats(
                {
                    "loss/total": loss,
                    "loss/policy": policy_loss,
                    "loss/value": value_loss,
                    "policy/entropy": entropy,
                    "policy/importance_ratio_mean": ratio.mean(),
                    "policy/rho_clipped_fraction": (ratio > learn.rho_clip).float().mean(),
                    "value/v_mean": values.mean(),
                    "value/vtrace_target_mean": targets.vs.mean(),
                }
            )
        scalars["optim/grad_norm"] = math.nan if grad_norm is None else grad_norm
        scalars["optim/learning_rate"] = learning_rate(self.optimizer)
        return UpdateInfo(
            loss=scalars["loss/total"],
            q_mean=scalars["value/v_mean"],
            td_abs=targets.pg_advantages.abs().mean(dim=1).cpu().numpy(),
            entropy=scalars["policy/entropy"],
            scalars=scalars,
        )
