"""IMPALA: an actor-critic trained on unrolls of T steps with V-trace off-policy
correction (Espeholt et al., 2018). Pure torch.

The collectors act with whatever version they have and record the behaviour
policy's log-probabilities; V-trace corrects for the lag between that policy and the
one being trained, with importance weights clipped at `rho_clip` (for the targets'
and the policy gradient's TD errors) and `c_clip` (for how far corrections travel
back). An episode's end stops the corrections; its last step bootstraps 0 when the
episode terminated, and the learner's value of the final observation when a time
limit truncated it (the `truncated` and `final_obs` columns), as PPO's GAE does:
cutting CartPole-v1 at 500 steps is no terminal state.

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

    `discounts[t]` is gamma, or 0 where the episode ended after step t. A truncated
    episode's bootstrap comes in its last step's reward, `r + gamma * V(final_obs)`
    (`truncation_bootstrap`): with discount 0 there, that step's target is the one
    V-trace gives an unroll's last step with `final_obs` as its bootstrap state.
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


#: The columns of time-limit truncations: the flag and the observation each step ended
#: on. Without them a truncation is trained as a termination.
TRUNCATION_COLUMNS = ("truncated", "final_obs")


def truncation_bootstrap(
    model: ActorCritic, truncated: torch.Tensor, final_obs: torch.Tensor
) -> torch.Tensor:
    """[B, T]: V(final_obs) at the steps a time limit cut an episode, 0 elsewhere.

    Only those observations go through the critic (a few per batch: one per
    time-limited episode), not the B * T that the column holds."""
    where = truncated.bool()
    values = torch.zeros(truncated.shape, device=truncated.device)
    if where.any():
        values[where] = model.value(final_obs[where]).to(values.dtype)
    return values


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

    def targets(self, columns: dict[str, np.ndarray]) -> VTrace:
        """The V-trace targets and advantages of a batch of unrolls under the current
        network: what `learn_batch` trains toward, without training."""
        with torch.no_grad():
            t = self._tensors(columns)
            _, target_logp, values = self._forward(t)
            return self._targets(t, target_logp, values)

    def _tensors(self, columns: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        # Without the truncation columns (tests comparing against the old targets),
        # every episode end is a termination.
        names = tuple(k for k in COLUMNS if k not in TRUNCATION_COLUMNS or k in columns)
        return {k: torch.as_tensor(columns[k], device=self.device) for k in names}

    def _forward(
        self, t: dict[str, torch.Tensor]
    ) -> tuple[torch.distributions.Distribution, torch.Tensor, torch.Tensor]:
        """The policy over every step (flat [B * T]), and the log-probabilities of the
        recorded actions and the values, [B, T]."""
        obs = t["obs"]  # [B, T, obs]
        batch, steps = obs.shape[:2]
        dist, flat_values = self.model.distribution_and_value(
            obs.reshape(batch * steps, *obs.shape[2:])
        )
        action = t["action"].reshape(batch * steps, *t["action"].shape[2:])
        target_logp = self.model.log_prob(dist, action).reshape(batch, steps)
        return dist, target_logp, flat_values.reshape(batch, steps)

    def _targets(
        self, t: dict[str, torch.Tensor], target_logp: torch.Tensor, values: torch.Tensor
    ) -> VTrace:
        """V-trace over the batch, from the learner's log-probabilities and values
        (detached: targets carry no gradient)."""
        learn, gamma = self.config.learn, self.config.discount_factor
        with torch.no_grad():
            bootstrap = self.model.value(t["bootstrap_obs"])
            rewards = t["reward"]
            if all(k in t for k in TRUNCATION_COLUMNS):
                rewards = rewards + gamma * truncation_bootstrap(
                    self.model, t["truncated"], t["final_obs"]
                )
        # `done` is any end, so the corrections stop at a truncation too: the next
        # step is another episode's.
        return vtrace(
            t["logp"],
            target_logp,
            rewards,
            gamma * (1.0 - t["done"]),
            values,
            bootstrap,
            learn.rho_clip,
            learn.c_clip,
        )

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> UpdateInfo:
        learn = self.config.learn
        t = self._tensors(columns)
        dist, target_logp, values = self._forward(t)
        targets = self._targets(t, target_logp.detach(), values.detach())
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
