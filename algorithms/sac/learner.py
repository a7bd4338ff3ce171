"""SAC for continuous actions: a tanh-squashed Gaussian actor, twin Q critics with
Polyak-averaged targets, and automatic entropy tuning (Haarnoja et al., 2018).
Pure torch.

Actions in segments are normalized to [-1, 1] (the collector scales them to the
env's bounds), so the networks never see the bounds.

Usage::

    sac = SAC(policy_config)
    info = sac.learn_batch(columns, weights)   # one critic, actor and alpha step
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from algorithms.dqn.learner import TransitionBatch
from algorithms.sac.networks import SquashedGaussianActor, TwinQ
from algorithms.step import adam, finite_step, learning_rate, load_optimizer_state, to_floats
from algorithms.sync import LOCAL, GradientSync
from common.config import PolicyConfig
from common.models import load_numpy_state


@dataclass(frozen=True)
class UpdateInfo:
    loss: float
    q_mean: float
    td_abs: np.ndarray
    alpha: float
    entropy: float
    scalars: dict[str, float]  # TensorBoard tags (algorithms.base.BatchReport)


class SAC:
    def __init__(self, config: PolicyConfig, device: str | torch.device = "cpu") -> None:
        model, learn = config.model, config.learn
        assert model.obs_shape is not None and model.action_shape is not None
        self.config = config
        self.device = torch.device(device)
        hidden = list(model.encoder_hidden_size_list)
        self.actor = SquashedGaussianActor(model).to(self.device)
        self.online = self.actor  # what a policy version publishes
        self.critic = TwinQ(model.obs_shape, model.action_shape, hidden).to(self.device)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(
            np.log(learn.init_alpha), device=self.device, requires_grad=True
        )
        self.target_entropy = -float(model.action_shape)
        rate = learn.learning_rate
        self.actor_optimizer = adam(self.actor.parameters(), lr=learn.learning_rate_policy or rate)
        self.critic_optimizer = adam(self.critic.parameters(), lr=learn.learning_rate_q or rate)
        self.alpha_optimizer = adam([self.log_alpha], lr=learn.learning_rate_alpha or rate)
        self.train_iter = 0
        #: Averages gradients across the ranks of a learner group (LOCAL: none).
        self.sync: GradientSync = LOCAL
        #: Batches with a non-finite loss: the steps on those losses were not taken.
        self.skipped_updates = 0

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> UpdateInfo:
        batch = TransitionBatch.from_numpy(columns, weights, self.device)
        learn = self.config.learn
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_logp = self.actor.sample(batch.next_obs)
            next_q = torch.min(*self.target(batch.next_obs, next_action)) - alpha * next_logp
            target = batch.reward + batch.discount * (1.0 - batch.done) * next_q
        q1, q2 = self.critic(batch.obs, batch.action)
        critic_loss = (batch.weight * ((q1 - target) ** 2 + (q2 - target) ** 2)).mean() / 2
        critic_norm = finite_step(critic_loss, self.critic_optimizer, sync=self.sync)

        action, logp = self.actor.sample(batch.obs)
        # The actor's loss backpropagates through the critics to the action only: with
        # their weights frozen, backward skips the critics' weight gradients (a third
        # of the update's matrix products), which the actor's step would not use.
        self.critic.requires_grad_(False)
        try:
            q_new = torch.min(*self.critic(batch.obs, action))
            actor_loss = (alpha * logp - q_new).mean()
            actor_norm = finite_step(actor_loss, self.actor_optimizer, sync=self.sync)
        finally:
            self.critic.requires_grad_(True)

        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        # The temperature is averaged like any parameter: one alpha on every rank.
        alpha_norm = finite_step(alpha_loss, self.alpha_optimizer, sync=self.sync)
        if None in (critic_norm, actor_norm, alpha_norm):
            self.skipped_updates += 1

        with torch.no_grad():
            for t, o in zip(self.target.parameters(), self.critic.parameters(), strict=True):
                t.lerp_(o, learn.target_theta or 0.005)
        self.train_iter += 1
        td_abs = (q1 - target).detach().abs()
        scalars = to_floats(
            {
                "loss/critic": critic_loss,
                "loss/actor": actor_loss,
                "loss/alpha": alpha_loss,
                "value/q1_mean": q1.mean(),
                "value/q2_mean": q2.mean(),
                "value/target_q_mean": target.mean(),
                "policy/entropy": -logp.mean(),
                "policy/alpha": alpha,
            }
        )
        for name, norm in (("critic", critic_norm), ("actor", actor_norm)):
            scalars[f"optim/{name}_grad_norm"] = math.nan if norm is None else norm
        scalars["optim/critic_learning_rate"] = learning_rate(self.critic_optimizer)
        scalars["optim/actor_learning_rate"] = learning_rate(self.actor_optimizer)
        return UpdateInfo(
            loss=scalars["loss/critic"],
            q_mean=scalars["value/q1_mean"],
            td_abs=td_abs.cpu().numpy(),
            alpha=scalars["policy/alpha"],
            entropy=scalars["policy/entropy"],
            scalars=scalars,
        )

    def state_dict(self) -> dict:
        return {
            "online": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target": self.target.state_dict(),
            "log_alpha": self.log_alpha.detach(),
            "optimizers": [
                o.state_dict()
                for o in (self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer)
            ],
            "train_iter": self.train_iter,
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["online"])
        self.critic.load_state_dict(state["critic"])
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        optimizers = (self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer)
        for optimizer, saved in zip(optimizers, state["optimizers"], strict=True):
            load_optimizer_state(optimizer, saved)
        self.train_iter = int(state["train_iter"])

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        """A published version holds the actor only; the critics keep their weights."""
        load_numpy_state(self.actor, tensors)
