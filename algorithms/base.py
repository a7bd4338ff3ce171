"""The contract every algorithm keeps: what it declares, how it acts, how it learns.

An algorithm is one entry of `algorithms.registry.ALGORITHMS`, keyed by its
`policy.type`. The config reads its defaults and action spaces; a workflow reads its
collect unit (to know whether it can run it); the collector builds its actor and
the learner its learner. Nothing outside the registry names an algorithm.

This module, the registry and each algorithm's `__init__.py` and `config.py` import
no torch, so the coordinator, which validates configs, stays light; the factories import the
algorithm's torch modules when they are called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from common.columns import Column, job_columns
from common.config import ActionSpace, PolicyConfig

if TYPE_CHECKING:
    import numpy as np
    import torch

    from algorithms.sync import GradientSync

#: What one item of step data is, and so which loop a collector runs: an n-step
#: transition, a fixed-length unroll, or a step of an on-policy round.
CollectUnit = Literal["transitions", "unrolls", "rounds"]

#: The columns each unit's collect loop can write from the env's steps (an
#: algorithm's actor records any others it declares: `RecordingActor`).
UNIT_COLUMNS: dict[CollectUnit, frozenset[str]] = {
    "transitions": frozenset({"obs", "action", "reward", "next_obs", "done", "discount"}),
    "unrolls": frozenset(
        {"obs", "action", "reward", "logp", "done", "truncated", "final_obs", "bootstrap_obs"}
    ),
    # the battle loop (self-play) writes the legal-action mask of each step too, and
    # the sync loop each env's discounted return so far (reward normalization)
    "rounds": frozenset(
        {"obs", "action", "logp", "adv", "ret", "action_mask", "discounted_return"}
    ),
}


@runtime_checkable
class Actor(Protocol):
    """The acting side, as a collector calls it (the `unit`-specific protocols below
    add what each collect loop needs).

    Usage (an evaluation)::

        actor = ALGORITHMS[config.policy.type].make_actor(config.policy)
        actor.load(ref.version, store.read_policy(ref.path).tensors)
        while episodes_left:
            obs = env.step(actor.greedy(obs, rng)).obs
    """

    #: The policy version acted with (0 before the first one).
    version: int
    #: Whether a version (or a checkpoint's weights) has been loaded.
    loaded: bool
    #: The network a policy file holds: the learner's `online` network.
    network: torch.nn.Module

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        """Act with a published version's weights from now on."""
        ...

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """What the env receives for an action as the actor records it."""
        ...

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Env actions for evaluation: the policy's most likely ones."""
        ...


@runtime_checkable
class TransitionActor(Actor, Protocol):
    """The `transitions` unit: one action per env and step, which the collector turns
    into n-step transitions.

    Usage::

        actions = actor.act(obs, rng, job_env_steps)
        step = env.step(actor.env_action(actions))
        builder.add(obs, actions, step.reward, step.final_obs, step.terminated, step.truncated)
        ctx.progress.update(actor.exploration(job_env_steps))
    """

    def act(self, obs: np.ndarray, rng: np.random.Generator, job_env_steps: int) -> np.ndarray:
        """Collecting actions; exploration follows the whole job's env steps, so adding
        collectors does not slow its schedule down."""
        ...

    def exploration(self, job_env_steps: int) -> dict[str, float]:
        """What the task's progress shows about exploration now (DQN: epsilon)."""
        ...


@runtime_checkable
class SamplingActor(Actor, Protocol):
    """The `unrolls` and `rounds` units: sampled actions with the behaviour policy's
    log-probabilities and the critic's values, which the collector records.

    Usage::

        action, logp, value = actor.sample(obs)
        step = env.step(actor.env_action(action))
        next_value = actor.value(step.final_obs)
    """

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions, their log-probabilities, state values) for a batch of obs."""
        ...

    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values for a batch of obs."""
        ...

    def scale_rewards(self, reward: np.ndarray) -> np.ndarray:
        """Rewards as the round's advantages are computed from (the `rounds` loop):
        scaled where the version carries reward statistics, else as they are."""
        ...


@runtime_checkable
class RecordingActor(Protocol):
    """An actor of an algorithm that declares columns of its own (`Column.from_actor`:
    an action mask it saw, its recurrent state, its Q-values): the collector asks
    after each act or sample and writes them with the step.

    Usage::

        actions = actor.act(obs, rng, job_env_steps)
        extra = actor.recorded()       # {name: one row per env}, for each such column
    """

    def recorded(self) -> dict[str, np.ndarray]:
        """The values of its `from_actor` columns for the batch it last acted on."""
        ...


@runtime_checkable
class RecurrentActor(Protocol):
    """An actor that keeps a recurrent state per env (R2D2): the loops tell it, after
    every vector step, which envs' episodes ended, and it starts those afresh.

    Usage::

        step = env.step(actor.env_action(actor.act(obs, rng, job_env_steps)))
        actor.reset_state(step.ended)
    """

    def reset_state(self, ended: np.ndarray) -> None:
        """Zero the state of the envs where `ended` is true."""
        ...


@runtime_checkable
class Learner(Protocol):
    """The learning side, as the learner service calls it (loss and update rule in
    pure torch: no I/O, no HTTP).

    Usage::

        learner = ALGORITHMS[config.policy.type].make_learner(config.policy, device)
        learner.load_state_dict(checkpoint["model"])          # resume
        report = learner.learn_batch(columns, weights)         # or train_round(columns)
        store.write_policy(..., state_to_numpy(learner.online))
        torch.save({"model": learner.state_dict(), ...}, buffer)
    """

    device: torch.device
    #: The network a policy version publishes (and an actor's `network` loads).
    online: torch.nn.Module
    #: Updates taken so far (a checkpoint and a policy file carry it).
    train_iter: int
    #: Updates whose loss was not finite: no step was taken on them.
    skipped_updates: int
    #: How its optimizer steps agree with the other ranks of a learner group
    #: (`algorithms.sync`; `LOCAL` in one process). Every step goes through
    #: `algorithms.step.finite_step` with it.
    sync: GradientSync

    def state_dict(self) -> dict[str, Any]:
        """Everything to resume, loadable with `torch.load(weights_only=True)`; its
        `online` entry is the published network's state (evaluating a checkpoint
        reads it)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        """Take a published version's weights (newer than the checkpoint resumed
        from); whatever derives from them, such as a target network, restarts there."""
        ...


#: What a report's `scalars` are named: `<group>/<name>`, the group one of these, so
#: every algorithm's TensorBoard reads alike.
SCALAR_GROUPS = ("loss", "value", "policy", "optim")


class BatchReport(Protocol):
    loss: float
    #: The mean value estimate (Q for DQN and SAC, V for IMPALA).
    q_mean: float
    #: Per item |TD error| (or |advantage|): the new priorities.
    td_abs: np.ndarray
    #: What the learner's TensorBoard shows of this update, by `SCALAR_GROUPS` tag:
    #: each loss term (`loss/...`), value estimates (`value/...`), the policy's
    #: entropy and the like (`policy/...`), the gradient norm and learning rate
    #: (`optim/...`). The same tags, in the same order, at every update.
    scalars: dict[str, float]


class RoundReport(Protocol):
    loss: float
    entropy: float
    approx_kl: float
    #: As `BatchReport.scalars`, averaged over the round's updates.
    scalars: dict[str, float]


@runtime_checkable
class BatchLearner(Learner, Protocol):
    """Trains on batches as the buffer samples them (`transitions`, `unrolls`)."""

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> BatchReport:
        """One update on a batch of rows with their importance weights."""
        ...


@runtime_checkable
class RoundLearner(Learner, Protocol):
    """Trains on one whole on-policy round at a time (`rounds`)."""

    def train_round(self, columns: dict[str, np.ndarray], seed: int | None = None) -> RoundReport:
        """All updates on one round's rows (epochs of shuffled minibatches)."""
        ...


#: The actor and learner protocols each collect unit's loops call.
ACTOR_PROTOCOLS: dict[CollectUnit, type] = {
    "transitions": TransitionActor,
    "unrolls": SamplingActor,
    "rounds": SamplingActor,
}
LEARNER_PROTOCOLS: dict[CollectUnit, type] = {
    "transitions": BatchLearner,
    "unrolls": BatchLearner,
    "rounds": RoundLearner,
}


@runtime_checkable
class Algorithm(Protocol):
    """One algorithm, as the registry holds it.

    Usage::

        algorithm = ALGORITHMS[config.policy.type]
        config = deep_merge(algorithm.defaults, raw)           # then validated
        actor = algorithm.make_actor(config.policy)            # in a collector
        learner = algorithm.make_learner(config.policy, "cpu")  # in a learner
    """

    @property
    def name(self) -> str:
        """Its `policy.type`, and the `algo` in its policy files' headers."""
        ...

    @property
    def defaults(self) -> Mapping[str, Any]:
        """The config keys whose defaults differ for it: a nested dict the job's
        config is deep-merged over."""
        ...

    @property
    def collect_unit(self) -> CollectUnit:
        """What one item of its step data is; a workflow runs the algorithms whose
        unit it knows (`Workflow.collect_units`)."""
        ...

    @property
    def action_spaces(self) -> frozenset[ActionSpace]: ...

    @property
    def image_obs(self) -> bool:
        """Whether its networks take image observations (a CNN encoder) as well as
        vectors."""
        ...

    @property
    def recurrent(self) -> bool:
        """Its actor keeps a recurrent state per env and its learner trains on
        sequences (`[items, time]` batches with a `valid` mask)."""
        ...

    @property
    def columns(self) -> tuple[Column, ...]:
        """Its step data's columns, each with its kind (common/columns.py): what the
        collect loop writes (and its actor records), what the learner checks each
        segment against before training on it."""
        ...

    @property
    def column_names(self) -> tuple[str, ...]: ...

    def columns_for(self, policy: PolicyConfig) -> tuple[Column, ...]:
        """The columns a job's step data holds (`common.columns.job_columns`)."""
        ...

    def column_names_for(self, policy: PolicyConfig) -> tuple[str, ...]: ...

    def make_actor(self, policy: PolicyConfig) -> Actor:
        """Its acting side for a config whose spaces are filled in."""
        ...

    def make_learner(self, policy: PolicyConfig, device: str | torch.device) -> Learner:
        """Its learning side for a config whose spaces are filled in."""
        ...

    @property
    def config(self) -> type[PolicyConfig]:
        """Its `policy` section: a subclass of `common.config.PolicyConfig` with its
        own keys (in its folder's `config.py`), its `type` a Literal of its name."""
        ...


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    """An `Algorithm` as plain values: what each algorithm's `__init__.py` declares.

    The factories import the algorithm's torch modules when called, so building a
    spec (and importing the registry) imports no torch.
    """

    name: str
    defaults: Mapping[str, Any]
    collect_unit: CollectUnit
    action_spaces: frozenset[ActionSpace]
    image_obs: bool = False
    #: Its actor keeps a recurrent state per env (`RecurrentActor`), and its learner
    #: trains on sequences: `[items, time]` batches with a `valid` mask (R2D2).
    recurrent: bool = False
    columns: tuple[Column, ...]
    make_actor: Callable[[PolicyConfig], Actor]
    make_learner: Callable[[PolicyConfig, str | torch.device], Learner]
    #: Its `policy` section's class (its own keys; a key only other algorithms' classes
    #: have is one a job of this algorithm ignores, and is warned about).
    config: type[PolicyConfig]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def columns_for(self, policy: PolicyConfig) -> tuple[Column, ...]:
        return job_columns(self.columns, policy)

    def column_names_for(self, policy: PolicyConfig) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns_for(policy))
