"""R2D2 (Kapturowski et al. 2019): double-Q n-step learning of a recurrent Q-network on
replayed sequences, from the LSTM state the actor stored, after a burn-in, in the
rescaled value space. Pure torch: no I/O, no HTTP.

One update on a batch of sequences [B, T] (T = burnin_step + unroll_len, rows past a
short sequence's end are padding, `valid` 0):

1. both networks run the first `burnin_step` steps without gradients from the stored
   state (`h[:, 0]`, `c[:, 0]`), the online one then the rest with gradients; a
   sequence that starts its episode (its stored state is zeros: the actor starts every
   episode from zeros) has no burn-in: zeros are its exact state whatever the network,
   so the online network runs it from its first row with gradients, and its first
   `burnin_step` steps are learned too;
2. step t's target sums the rewards of steps t .. t+n-1 (stopping at the episode's
   termination) and bootstraps, unless it terminated, from
   Q_target(s_{t+n}, argmax_a Q_online(s_{t+n}, a)), read at row t+n of the same
   sequence; a step whose row t+n is past the sequence's valid rows, and whose episode
   did not terminate before, is not learned here (the next, overlapping, sequence
   learns it);
3. the loss is the mean over the batch's sequences of each one's mean squared (or
   Huber) TD error over its learned steps, weighted by its importance weight (a mean
   of per-sequence means: a learner group's ranks, each with an equal share of the
   sequences, average to exactly the whole batch's loss); a sequence's new priority
   is eta * max + (1 - eta) * mean of its |TD errors|.

Usage::

    r2d2 = R2D2(policy_config, device="cpu")
    report = r2d2.learn_batch(columns, weights)    # report.td_abs -> new priorities
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from algorithms.checkpoint import TargetNetworkState
from algorithms.r2d2.config import R2D2Config
from algorithms.r2d2.networks import RecurrentQNetwork
from algorithms.step import (
    TDReport,
    adam,
    device_step,
    td_report,
    to_device,
)
from algorithms.sync import LOCAL, GradientSync
from common.config import PolicyConfig

#: The `h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x` of Pohlen et al. (2018): its linear
#: term keeps it invertible (and its inverse Lipschitz).
RESCALE_EPS = 1e-3
#: The priority of a sequence with no learned step (one too short to reach a bootstrap
#: row, nor ending its episode): small, so it is seldom sampled again, but not zero.
UNLEARNED_PRIORITY = 1e-3


def value_rescale(x: torch.Tensor, eps: float = RESCALE_EPS) -> torch.Tensor:
    """h(x): shrinks large returns roughly to their square root."""
    return x.sign() * ((x.abs() + 1.0).sqrt() - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = RESCALE_EPS) -> torch.Tensor:
    """h^-1(x), exactly (Pohlen et al. 2018, Proposition A.2)."""
    root = ((1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)).sqrt() - 1.0) / (2.0 * eps)
    return x.sign() * (root.square() - 1.0)


def at_offset(x: torch.Tensor, steps: int) -> torch.Tensor:
    """x[:, t + steps] at each t of x's time axis (dim 1), zeros past its end."""
    pad = [0, 0] * (x.dim() - 2) + [0, steps]
    return F.pad(x, pad)[:, steps : steps + x.shape[1]]


@dataclass(frozen=True)
class NStep:
    """What the n-step targets of each step [B, T] of a sequence are made of."""

    #: Rewards of steps t .. t+n-1, discounted, up to the episode's termination.
    returns: torch.Tensor
    #: 1 where the episode terminated within those steps: nothing to bootstrap.
    terminated: torch.Tensor
    #: 1 where row t+n is a valid row of the sequence, to bootstrap from.
    has_next: torch.Tensor


def nstep_returns(
    reward: torch.Tensor, done: torch.Tensor, valid: torch.Tensor, nstep: int, gamma: float
) -> NStep:
    """Each step's n-step return within its sequence (padding rows are zeros)."""
    reward, done = reward * valid, done * valid
    steps = reward.shape[1]
    returns = torch.zeros_like(reward)
    alive = torch.ones_like(reward)  # not terminated before step t + k
    for k in range(nstep):
        returns = returns + gamma**k * alive * at_offset(reward, k)
        alive = alive * (1.0 - at_offset(done, k))
    has_next = at_offset(valid, nstep)
    assert has_next.shape[1] == steps
    return NStep(returns=returns, terminated=1.0 - alive, has_next=has_next)


@dataclass(frozen=True)
class SequenceBatch:
    """Sequences as tensors, padding rows zeroed (so whatever they held changes
    nothing); see `algorithms/r2d2/__init__.py` for the columns."""

    obs: torch.Tensor  # [B, T, *obs_shape]
    action: torch.Tensor  # [B, T] int64
    reward: torch.Tensor  # [B, T]
    done: torch.Tensor  # [B, T] 1.0 where the episode terminated at this step
    valid: torch.Tensor  # [B, T] 1.0 for real rows, 0.0 for padding
    h0: torch.Tensor  # [B, H] the actor's LSTM state before row 0
    c0: torch.Tensor  # [B, H]
    weight: torch.Tensor  # [B] importance weights (1.0 when not used)
    #: [B] True where the sequence starts its episode: its stored state is zeros (the
    #: actor's state along an episode is never exactly zeros). A numpy array, on the
    #: host: which sequences skip the burn-in is decided without waiting on the device.
    starts_episode: np.ndarray

    @classmethod
    def from_numpy(
        cls, columns: dict[str, np.ndarray], weight: np.ndarray, device: torch.device
    ) -> SequenceBatch:
        valid = to_device(np.asarray(columns["valid"], np.float32), device)
        real = valid > 0

        def t(name: str) -> torch.Tensor:
            tensor = to_device(columns[name], device)
            mask = real.reshape(*real.shape, *([1] * (tensor.dim() - 2)))
            return torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=device))

        h0, c0 = columns["h"][:, 0], columns["c"][:, 0]
        starts_episode = ~(np.any(h0 != 0, axis=1) | np.any(c0 != 0, axis=1))
        return cls(
            obs=t("obs"),
            action=t("action").long(),
            reward=t("reward").float(),
            done=t("done").float(),
            valid=valid,
            h0=to_device(np.ascontiguousarray(h0), device).float(),
            c0=to_device(np.ascontiguousarray(c0), device).float(),
            weight=to_device(weight.astype(np.float32), device),
            starts_episode=starts_episode,
        )


def learned_steps(batch: SequenceBatch, parts: NStep, burnin: int) -> torch.Tensor:
    """1 at each step [B, T] an update learns: a valid row with a whole n-step target
    (it bootstraps from a row of its sequence, or its episode terminates first), after
    the burn-in, or from row 0 in a sequence that starts its episode."""
    after_burnin = torch.arange(batch.valid.shape[1], device=batch.valid.device) >= burnin
    starts = to_device(batch.starts_episode, batch.valid.device)
    learnable = after_burnin[None, :] | starts[:, None]
    return batch.valid * torch.maximum(parts.terminated, parts.has_next) * learnable


#: What an update reports: `q_mean` in returns (not the rescaled space), and per
#: sequence eta * max + (1 - eta) * mean |TD error| over its learned steps.
UpdateInfo = TDReport


class R2D2(TargetNetworkState):
    """The learner: online and target recurrent Q-networks, one Adam step a batch."""

    def __init__(self, config: PolicyConfig, device: str | torch.device = "cpu") -> None:
        if not isinstance(config, R2D2Config):
            raise TypeError(f"R2D2 takes an R2D2Config, not {type(config).__name__}")
        self.config = config
        self.device = torch.device(device)
        self.online = RecurrentQNetwork(config.model).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = adam(self.online.parameters(), lr=config.learn.learning_rate)
        self.train_iter = 0
        #: Averages gradients across the ranks of a learner group (LOCAL: none).
        self.sync: GradientSync = LOCAL
        #: Batches whose loss was not finite: no step was taken on them.
        self.skipped_updates = 0

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> UpdateInfo:
        """One update on a batch of sequences (what the learner's loop calls)."""
        return self.update(SequenceBatch.from_numpy(columns, weights, self.device))

    def update(self, batch: SequenceBatch) -> UpdateInfo:
        """One gradient step on a batch of sequences (the steps: the module's docstring)."""
        config = self.config
        learn = config.learn
        burnin, nstep, gamma = config.burnin_step, config.nstep, config.discount_factor
        rescale = learn.value_rescale

        with torch.no_grad():  # the target network: burn-in and the rest at once
            target_q, _ = self.target(batch.obs, (batch.h0, batch.c0))
        q_all = self._online_q(batch, burnin)  # [B, T, A]
        q = q_all.gather(2, batch.action[:, :, None]).squeeze(2)

        with torch.no_grad():
            # Double Q: the online net picks the action at row t+n, the target net values it.
            next_action = at_offset(q_all.detach(), nstep).argmax(dim=2, keepdim=True)
            next_q = at_offset(target_q, nstep).gather(2, next_action).squeeze(2)
            if rescale:
                next_q = inverse_value_rescale(next_q)
            parts = nstep_returns(batch.reward, batch.done, batch.valid, nstep, gamma)
            bootstrap = (1.0 - parts.terminated) * parts.has_next
            target = parts.returns + gamma**nstep * bootstrap * next_q
            if rescale:
                target = value_rescale(target)
            learned = learned_steps(batch, parts, burnin)

        td = target - q
        if learn.td_loss == "huber":
            per_step = F.smooth_l1_loss(q, target, reduction="none")
        else:
            per_step = td.square()
        weight = batch.weight if config.priority_IS_weight else 1.0
        steps = learned.sum()
        per_sequence_loss = (learned * per_step).sum(dim=1) / learned.sum(dim=1).clamp(min=1.0)
        loss = (weight * per_sequence_loss).mean()
        grad_norm = device_step(
            loss, self.optimizer, self.online.parameters(), learn.max_grad_norm, sync=self.sync
        )
        self.train_iter += 1
        self._update_target()

        with torch.no_grad():
            td_abs = td.detach().abs() * learned
            per_sequence = learned.sum(dim=1)
            eta = learn.priority_eta
            mean = td_abs.sum(dim=1) / per_sequence.clamp(min=1.0)
            priority = eta * td_abs.amax(dim=1) + (1.0 - eta) * mean
            priority = torch.where(
                per_sequence > 0, priority, torch.full_like(priority, UNLEARNED_PRIORITY)
            )
            returns_q = inverse_value_rescale(q.detach()) if rescale else q.detach()
            returns_target = inverse_value_rescale(target) if rescale else target
            denominator = steps.clamp(min=1.0)
            # Everything the update reports, read from the device at once.
            report, skipped = td_report(
                {
                    "loss/td": loss,
                    "value/q_mean": (returns_q * learned).sum() / denominator,
                    "value/target_q_mean": (returns_target * learned).sum() / denominator,
                    "value/td_abs_mean": td_abs.sum() / denominator,
                    "optim/grad_norm": grad_norm,
                },
                priority,
                self.optimizer,
            )
        self.skipped_updates += skipped
        return report

    def _online_q(self, batch: SequenceBatch, burnin: int) -> torch.Tensor:
        """The online network's Q-values [B, T, A], with gradients from the first row
        each sequence learns: a sequence that starts its episode runs from row 0; any
        other warms its stored state up over the burn-in without gradients first (its
        burn-in rows' Q-values are zeros, never read: no step there is learned, and a
        learned step bootstraps from a row after them)."""
        starts = batch.starts_episode
        if not burnin or starts.all():
            return self.online(batch.obs, (batch.h0, batch.c0))[0]
        if not starts.any():  # the usual batch: no gather, no reordering
            return self._warmed_q(batch.obs, batch.h0, batch.c0, burnin)
        # Each kind runs as one batch: rows of the batch, as indexes on the device.
        fresh = to_device(np.flatnonzero(starts), batch.obs.device)
        warm = to_device(np.flatnonzero(~starts), batch.obs.device)
        q_fresh = self.online(batch.obs[fresh], (batch.h0[fresh], batch.c0[fresh]))[0]
        q_warm = self._warmed_q(batch.obs[warm], batch.h0[warm], batch.c0[warm], burnin)
        # Back in the batch's order: row i of the joined parts is sequence order[i].
        order = torch.cat([fresh, warm])
        return torch.cat([q_fresh, q_warm])[torch.argsort(order)]

    def _warmed_q(
        self, obs: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, burnin: int
    ) -> torch.Tensor:
        """The online network's Q-values [B, T, A] of sequences that warm their stored
        state up over the burn-in without gradients first (burn-in rows: zeros)."""
        with torch.no_grad():
            _, warmed = self.online(obs[:, :burnin], (h0, c0))
        q_rest, _ = self.online(obs[:, burnin:], warmed)
        return F.pad(q_rest, (0, 0, burnin, 0))

    def _update_target(self) -> None:
        learn = self.config.learn
        self.update_target(learn.target_update_theta, learn.target_update_freq)
