"""The job config's schema: the sections every job has, as frozen dataclasses.

This is the base layer: it imports no algorithm. What one algorithm adds (its own
`learn`, `collect`, `model` or `other` keys) is a subclass of these sections in its
folder (`algorithms/<name>/config.py`), named by its registry entry; resolving a raw
config (merging defaults, choosing the algorithm's sections by `policy.type`,
did-you-mean, DI-engine files) is `jobconfig/`, a layer above both.

Key names follow DI-engine wherever it has the same knob, so its users can bring
their configs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, MaxLen, MinLen
from pydantic import ConfigDict, with_config

from common.messages import MAX_SHARDS

ActionSpace = Literal["discrete", "continuous"]
PosInt = Annotated[int, Gt(0)]
EnvManager = Literal["sync", "async", "envpool"]
ObsDtype = Literal["float32", "uint8"]
Encoder = Literal["auto", "mlp", "conv", "nature_cnn", "impala_resnet"]
PosFloat = Annotated[float, Gt(0)]
Fraction = Annotated[float, Ge(0), Le(1)]

# Configs are written by people in YAML, where `1e-3` is a string: validate in lax
# mode so such values still become numbers, but refuse any key we do not know.
CONFIG_SECTION = ConfigDict(extra="forbid")

# Upper bounds that keep one job from taking a whole machine by accident.
MAX_ENVS_PER_WORKER = 1024
MAX_BUFFER_ITEMS = 50_000_000
#: Rows of one sampled sequence at most (episode and sequence items).
MAX_SEQUENCE_LENGTH = 4096


def section(cls: type) -> type:
    return with_config(CONFIG_SECTION)(dataclass(frozen=True, kw_only=True)(cls))


class ConfigError(ValueError):
    """An invalid config; `field` is the dotted path of the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@section
class EnvConfig:
    #: A gymnasium id in the registry the operator allowed (common/env_guard.py).
    env_id: str = "CartPole-v1"
    #: What makes the envs and reports their spaces (`ENV_ADAPTERS` in common/envs.py).
    adapter: Annotated[str, MaxLen(64)] = "gymnasium"
    #: Parallel environments in each collector's vector env.
    collector_env_num: Annotated[int, Gt(0), Le(MAX_ENVS_PER_WORKER)] = 8
    #: Parallel environments used by an evaluation task.
    evaluator_env_num: Annotated[int, Gt(0), Le(MAX_ENVS_PER_WORKER)] = 5
    #: Episodes per evaluation.
    n_evaluator_episode: Annotated[int, Gt(0), Le(10_000)] = 10
    #: Mean evaluation return at which the job has succeeded (None: never by return).
    stop_value: float | None = None
    #: Keyword arguments for `gymnasium.make`.
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: How a collector steps its envs: `sync` (one process), `async` (worker
    #: subprocesses over shared memory) or `envpool` (its C++ thread pool; Atari and
    #: MuJoCo ids). All three give the same observations and rewards.
    manager: EnvManager = "sync"
    #: `async`: worker subprocesses per vector env; `envpool`: its threads (None: one per
    #: CPU, at most one per env; half that for each half of a double-buffered collector).
    num_workers: Annotated[int, Gt(0), Le(256)] | None = None
    #: Collectors of async workflows step half their envs while the policy acts on the
    #: other half (services/collector/stepping.py): for `envpool` and `async`, whose
    #: stepping leaves the GIL free, on machines where acting and stepping do not
    #: share the same cores (a GPU policy).
    double_buffer: bool = False
    #: A Dict observation's key to train on (MiniGrid: `image`); None takes the whole
    #: Dict, which must then hold flat Box and Discrete parts only.
    obs_key: Annotated[str, MaxLen(64)] | None = None
    #: Only these entries of a vector observation are seen (e.g. `[0, 2]`: CartPole's
    #: positions without their velocities, a partially observed task); None: all.
    observation_filter: Annotated[list[Annotated[int, Ge(0)]], MinLen(1), MaxLen(4096)] | None = (
        None
    )
    #: The last this many observations stacked along a new first axis (None: Atari 4,
    #: others 1).
    frame_stack: Annotated[int, Gt(0), Le(64)] | None = None
    #: Atari preprocessing (ale_py envs), as DQN's Nature paper: frames repeated per
    #: action (the max of the last two kept), up to `noop_max` random no-ops at reset,
    #: `screen_size` square grayscale frames.
    frame_skip: Annotated[int, Gt(0), Le(16)] = 4
    noop_max: Annotated[int, Ge(0), Le(1000)] = 30
    screen_size: Annotated[int, Gt(0), Le(512)] = 84
    #: Training envs end an episode when a life is lost (None: on for Atari). Evaluation
    #: always plays whole games.
    episodic_life: bool | None = None
    #: Training envs give the reward's sign (None: on for Atari). Evaluation returns are
    #: always the unclipped score.
    clip_rewards: bool | None = None


@section
class ModelConfig:
    #: Observation size (an int) or shape (a list, channels first for images); filled
    #: in from the environment when left out.
    obs_shape: PosInt | list[PosInt] | None = None
    #: Filled in from the environment: `uint8` observations (images) stay uint8 from the
    #: env to the network, which scales them to [0, 1].
    obs_dtype: ObsDtype | None = None
    #: The observation encoder: `auto` takes `mlp` for vectors, `nature_cnn` for images
    #: of 36 pixels or more a side and `conv` (3x3 convolutions) for smaller ones;
    #: `impala_resnet` is IMPALA's 15-layer ResNet. For a CNN, the last entry of
    #: `encoder_hidden_size_list` is the size of its fully connected layer.
    encoder: Encoder = "auto"
    #: Number of discrete actions, or the size of a continuous action; filled in from
    #: the environment when left out.
    action_shape: PosInt | None = None
    #: Filled in from the environment: discrete (Discrete) or continuous (Box) actions.
    action_space: ActionSpace | None = None
    #: Filled in from the environment: it gives a legal-action mask with each
    #: observation (two-player games), which the networks apply to their logits.
    action_mask: bool | None = None
    #: Continuous actions: the Box's bounds (filled in from the environment).
    action_low: list[float] | None = None
    action_high: list[float] | None = None
    #: Hidden sizes of the encoder's layers (DI-engine's key).
    encoder_hidden_size_list: Annotated[list[PosInt], MinLen(1)] = field(
        default_factory=lambda: [128, 128, 64]
    )


@section
class LearnConfig:
    """The keys every algorithm's learner reads; an algorithm's own are in its
    subclass (`algorithms/<name>/config.py`)."""

    #: Items per update (unrolls for `unrolls`, minibatch rows for `rounds`).
    batch_size: Annotated[int, Gt(0), Le(8192)] = 64
    #: The optimizer's (Adam's) learning rate.
    learning_rate: PosFloat = 1e-3
    #: Gradient-norm clip (None: no clipping).
    max_grad_norm: PosFloat | None = 10.0
    #: Batches asked for in one sample request (one HTTP round trip).
    num_batches: Annotated[int, Gt(0), Le(256)] = 8
    #: How long one sample request may wait for data before it is asked again.
    sample_timeout_s: Annotated[float, Gt(0), Le(60)] = 5.0
    #: A new policy version is written every this many train iterations.
    publish_every_iters: PosInt = 10
    #: A checkpoint (model, target, optimizer, counters) every this many iterations.
    checkpoint_every_iters: PosInt = 1000
    #: Train data-parallel on a learner group (DI-engine's key, the same meaning):
    #: each rank takes an equal share of every batch and gradients are averaged across
    #: ranks every update. `drover run` then starts one rank per CUDA device (or
    #: `--learner-ranks N`), and the coordinator gives the job the free learner with
    #: the most ranks. Any job also trains on a learner group it is given.
    multi_gpu: bool = False
    #: Where a learner on its own asks for its batches and gathers their rows (batch
    #: training, the async workflow): `process`, a feeder process beside it, so that
    #: this work never holds the training thread's interpreter lock
    #: (services/learner/feeder.py); `thread`, a thread of the learner's own process.
    #: A learner group's rank 0 always uses a thread.
    feed: Literal["process", "thread"] = "process"
    #: The learner's own torch threads (None: `system.torch_num_threads`): an update of
    #: a 256-unit MLP on a batch of 256 gains from a second core, where the collectors'
    #: acting on a few observations at a time does not.
    torch_num_threads: Annotated[int, Gt(0), Le(256)] | None = None

    def threads(self, system_threads: int) -> int:
        """The torch threads a learner of this job trains with."""
        return self.torch_num_threads or system_threads


@section
class CollectConfig:
    """The keys every collect loop reads."""

    #: Transitions a collector hands its uploader at least at a time; what queues up
    #: while an upload is out goes as one segment (services/collector/uploader.py).
    n_sample: Annotated[int, Gt(0), Le(100_000)] = 64
    #: How often a collector asks for the newest policy version.
    policy_poll_s: Annotated[float, Gt(0), Le(60)] = 0.2
    #: How long one insert may wait for the rate limiter before it is retried.
    insert_timeout_s: Annotated[float, Gt(0), Le(60)] = 2.0
    #: Where collectors (and the evaluations they run) act: `auto`, on CUDA where the
    #: policy trains on CUDA (`policy.cuda`) and the collector has a CUDA device, else
    #: on CPU, so a job with a GPU learner also collects on machines without one;
    #: `cpu`; or `cuda`, only on collectors with a CUDA device.
    device: Literal["auto", "cpu", "cuda"] = "auto"


# What each collect unit's loop reads besides (services/collector/core.py): an
# algorithm of that unit takes these sections as the base of its own.


@section
class UnrollCollectConfig(CollectConfig):
    """The `unrolls` loop's keys."""

    #: Steps in each unroll (one buffer item per env and unroll).
    unroll_len: Annotated[int, Gt(0), Le(1000)] = 32


@section
class RoundCollectConfig(CollectConfig):
    """The `rounds` loop's keys: it computes the round's advantages."""

    #: The GAE lambda the collectors compute advantages with.
    gae_lambda: Fraction = 0.95


@section
class EvaluatorConfig:
    #: Evaluate the newest policy every this many train iterations.
    eval_freq: PosInt = 200
    #: When a budget (`system.max_env_step`, `max_train_iter`) ends the job, evaluate
    #: its newest policy first if no evaluation has: collecting and learning stop, one
    #: evaluation runs, and the job ends as its budget says, its last evaluation (its
    #: final return) being of the policy it ends with. Waits at most
    #: `DROVER_FINAL_EVAL_TIMEOUT_S` (the job then ends without it).
    final_eval: bool = False


@section
class EvalConfig:
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    #: Record a video of one greedy episode every this many evaluations (the first
    #: one included; None: none): an MP4 in the job's `videos/`, an animation in
    #: TensorBoard, a player on the dashboard's job page.
    video_every: PosInt | None = None


@section
class ReplayBufferConfig:
    #: Sampler: uniform, prioritized (proportional PER), or fifo (a queue: each item
    #: sampled once, oldest first, for on-policy use).
    type: Literal["uniform", "prioritized", "fifo"] = "uniform"
    #: Items the buffer holds at the most.
    replay_buffer_size: Annotated[int, Gt(0), Le(MAX_BUFFER_ITEMS)] = 100_000
    #: Which items leave a full buffer: the oldest, the newest, or random ones.
    eviction: Literal["fifo", "lifo", "uniform"] = "fifo"
    #: What one item is: a row of a segment (a transition, or an unroll whose columns
    #: have a time axis); a whole episode, from which a sub-sequence of up to
    #: `sequence_length` rows is sampled; or a sequence: each episode cut into windows
    #: of `sequence_length` rows, consecutive ones sharing `overlap` rows (an
    #: episode's last window may be shorter; the learner pads it and masks the
    #: padding). Episode and sequence items never cross an episode's end. The learner
    #: gets them as [batch, time] columns with a `valid` mask.
    item: Literal["transition", "episode", "sequence"] = "transition"
    #: Episode and sequence items: rows in each sampled (sub-)sequence.
    sequence_length: Annotated[int, Gt(0), Le(MAX_SEQUENCE_LENGTH)] = 1
    #: Sequence items: rows each window shares with the one before (R2D2: at least
    #: burnin_step + nstep, so that every step is learned by some window).
    overlap: Annotated[int, Ge(0)] = 0
    #: Prioritized: priority exponent, importance-weight exponent and the sampled
    #: batches over which beta rises to 1 (0: no annealing).
    alpha: Annotated[float, Ge(0), Le(1)] = 0.6
    beta: Fraction = 0.4
    beta_anneal_steps: Annotated[int, Ge(0)] = 100_000
    #: Added to |TD error| so no item's priority reaches zero.
    priority_eps: Annotated[float, Gt(0)] = 1e-6
    #: An item is retired after being sampled this many times (None: never).
    max_use: PosInt | None = None
    #: Items collected by a policy more than this many versions behind the newest are
    #: never sampled and are evicted (None: no limit).
    max_staleness: Annotated[int, Ge(0)] | None = None
    #: Sampled items per inserted item that the rate limiter keeps (None: no limit).
    samples_per_insert: PosFloat | None = None
    #: Items the buffer must hold before the first sample.
    min_size_to_sample: PosInt = 1000
    #: Allowed drift from `samples_per_insert`, in sampled items (None: derived).
    error_buffer: PosFloat | None = None
    #: Buffer processes the items are split over (a collector's segments go whole
    #: to one, in runs); a learner's draw over them has the distribution of one
    #: table, a fifo buffer's takes each shard's oldest in proportion to what each
    #: queues (services/buffer/sharding.py).
    shards: Annotated[int, Ge(1), Le(MAX_SHARDS)] = 1


#: The fixed opponents a league may hold (common/games.py plays them).
BaselineName = Literal["random", "heuristic"]


@section
class LeagueStopConfig:
    """The job has succeeded once a battle evaluation's win rate against `vs` reaches
    `win_rate` (draws count half)."""

    #: The baseline the win rate is measured against.
    vs: BaselineName = "heuristic"
    #: (wins + draws / 2) / games of the newest evaluation, at which the job succeeds.
    win_rate: Annotated[float, Gt(0), Le(1)] = 0.6


@section
class LeagueConfig:
    """The `selfplay` workflow's league (services/coordinator/league.py): past policy
    versions and fixed baselines as opponents, drawn by prioritized fictitious self-play,
    with a payoff table and ratings. Other workflows ignore it."""

    #: A snapshot of the learning policy joins the opponent pool every this many policy
    #: versions.
    snapshot_every: Annotated[int, Gt(0), Le(1_000_000)] = 10
    #: Past versions the pool holds at most; the oldest retires first. Baselines stay.
    pool_size: Annotated[int, Gt(0), Le(256)] = 8
    #: The fixed opponents always in the pool.
    baselines: Annotated[list[BaselineName], MaxLen(2)] = field(
        default_factory=lambda: ["random", "heuristic"]
    )
    #: How an opponent is chosen for each game (DI-engine's main player's `branch_probs`):
    #: `pfsp` draws from the pool, more often those the policy does badly against; `sp`
    #: plays the policy against itself. The two are normalized.
    branch_probs: dict[Literal["pfsp", "sp"], Annotated[float, Ge(0)]] = field(
        default_factory=lambda: {"pfsp": 0.5, "sp": 0.5}
    )
    #: PFSP's weight of an opponent beaten with probability p: `squared` (1 - p)^2,
    #: `variance` p(1 - p) (opponents of the policy's own strength), `linear` 1 - p.
    pfsp_weighting: Literal["squared", "variance", "linear"] = "squared"
    #: Games against an opponent before its win rate counts (DI-engine's payoff key);
    #: until then it is taken as 0.5.
    min_win_rate_games: Annotated[int, Ge(0), Le(10_000)] = 8
    #: Self-play games (the policy on both seats) store both sides' steps: the games
    #: are symmetric, so either side's moves are the learning policy's.
    both_sides: bool = True
    #: The baselines each battle evaluation plays `env.n_evaluator_episode` games
    #: against, half on each seat (None: all of `baselines`).
    eval_vs: list[BaselineName] | None = None
    #: A win rate against a baseline that ends the job (None: `env.stop_value` or the
    #: budgets only).
    stop: LeagueStopConfig | None = None


@section
class OtherConfig:
    replay_buffer: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)
    #: Self-play (`system.workflow: selfplay`): the league of opponents.
    league: LeagueConfig = field(default_factory=LeagueConfig)


@section
class PolicyConfig:
    """What every algorithm's `policy` section holds. An algorithm's config is a
    subclass (its `type` a Literal of its name, its own sections' subclasses), which
    `jobconfig` chooses by `policy.type`."""

    #: The algorithm: a name in `algorithms.registry.ALGORITHMS`.
    type: Annotated[str, MinLen(1), MaxLen(64)] = "dqn"
    #: Train and act on CUDA (DI-engine's key); `device` overrides it. Such a job runs
    #: only on workers that report CUDA devices (common/devices.py), never on CPU.
    cuda: bool = False
    device: Literal["cpu", "cuda"] | None = None
    #: The discount gamma of returns and targets.
    discount_factor: Annotated[float, Gt(0), Le(1)] = 0.99
    model: ModelConfig = field(default_factory=ModelConfig)
    learn: LearnConfig = field(default_factory=LearnConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    other: OtherConfig = field(default_factory=OtherConfig)

    @property
    def torch_device(self) -> str:
        return self.device or ("cuda" if self.cuda else "cpu")

    def check(self) -> None:
        """Checks across this algorithm's own keys (ConfigError naming the key); the
        shared sections' are `jobconfig`'s."""


@section
class TransitionPolicyConfig(PolicyConfig):
    """The `transitions` loop's keys: it builds n-step transitions."""

    #: Steps summed into each transition's return before bootstrapping.
    nstep: Annotated[int, Gt(0), Le(100)] = 1

    @property
    def collect_nstep(self) -> int:
        """The steps the collector sums into each row's return: `nstep`, unless the
        algorithm sums them itself over sequences (R2D2: 1)."""
        return self.nstep


@section
class EvaluateWorkflowConfig:
    """What an `evaluate` workflow job runs."""

    #: A policy file, a learner checkpoint, or uniformly random actions.
    source: Literal["policy", "checkpoint", "random"] = "random"
    #: The policy or checkpoint file, relative to the shared root.
    path: str | None = None
    #: Episodes in all, split over the collectors (None: env.n_evaluator_episode).
    episodes: Annotated[int, Gt(0), Le(1_000_000)] | None = None


@section
class SystemConfig:
    #: A name in `WORKFLOWS` (services/coordinator/workflows/), checked there:
    #: async: collectors and learner run freely, the rate limiter keeps the replay
    #: ratio. evaluate: no training; run `evaluate.source` for its episodes and report.
    #: sync: rounds of "collect exactly n_sample with version v, train on exactly that
    #: data, publish v + 1" (on-policy: PPO). selfplay: sync rounds of two-player games
    #: against a league of opponents (`policy.other.league`).
    workflow: Annotated[str, MinLen(1), MaxLen(64)] = "async"
    #: Data collected by a policy more than this many versions behind the learner's is
    #: not trained on (an async job's bound on policy lag; None: no bound).
    max_policy_lag: Annotated[int, Ge(0)] | None = None
    evaluate: EvaluateWorkflowConfig = field(default_factory=EvaluateWorkflowConfig)
    #: Collectors given to this job (None: as many as its share of the cluster). A
    #: `sync` job's round is split over exactly this many, which it holds all at once
    #: (None: its share when the round's collectors are first given). A job trains on
    #: one learner, which may be a group of ranks (`policy.learn.multi_gpu`).
    collector_num: Annotated[int, Gt(0), Le(1024)] | None = None
    #: The job's weight among running jobs of its priority: each is given collectors
    #: (and learners, where there are fewer than jobs) in proportion to it.
    share: Annotated[float, Gt(0), Le(1000)] = 1.0
    #: Higher first: a job takes workers from running jobs of lower priorities (ending
    #: their tasks at a safe point) and leaves the coordinator's queue before them.
    priority: Annotated[int, Ge(-1000), Le(1000)] = 0
    #: The job ends after this many env steps (None: no limit).
    max_env_step: PosInt | None = None
    #: The job ends after this many train iterations (None: no limit).
    max_train_iter: PosInt | None = None
    #: Seeds every task's RNGs (each task gets its own, derived from it).
    seed: Annotated[int, Ge(0), Le(2**31 - 1)] = 0
    #: torch threads per process; 1 keeps many processes from fighting over cores.
    torch_num_threads: Annotated[int, Gt(0), Le(256)] = 1
    #: How long a task's write to a full shared volume (no space, or over a quota) is
    #: tried again before the task fails with it, and how long the job may wait for
    #: room without progress before it fails: a volume that fills for a while pauses
    #: the job (its collectors stop stepping once their queue is full), it does not end
    #: it (common/storage_full.py).
    storage_grace_s: Annotated[float, Gt(0), Le(86_400)] = 300.0


@section
class JobConfig:
    """A resolved job config (`jobconfig.resolve_job_config`): its `policy` is the
    algorithm's own subclass of `PolicyConfig`."""

    #: The job's name (a run folder's prefix).
    exp_name: str = "drover"
    #: Unknown keys are errors (false: warnings, as they are in a DI-engine `.py`
    #: file, whose many keys drover has no use for).
    strict: bool = True
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig
    system: SystemConfig = field(default_factory=SystemConfig)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A new dict: `override` merged into `base`, recursing into nested dicts."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


MAX_CONFIG_DEPTH = 12
MAX_CONFIG_ITEMS = 10_000


def check_shape(raw: Any) -> None:
    """Refuse configs nested too deep or too large to be a real job's.

    Raises:
        ConfigError: naming the path where the limit was crossed.
    """
    items = 0
    stack: list[tuple[Any, str, int]] = [(raw, "config", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(path, f"nested deeper than {MAX_CONFIG_DEPTH} levels")
        children = (
            value.items()
            if isinstance(value, dict)
            else enumerate(value)
            if isinstance(value, list)
            else ()
        )
        for key, child in children:
            items += 1
            if items > MAX_CONFIG_ITEMS:
                raise ConfigError("config", f"more than {MAX_CONFIG_ITEMS} keys and items")
            stack.append((child, f"{path}.{key}", depth + 1))


def obs_shape_of(model: ModelConfig) -> tuple[int, ...]:
    """The model's observation shape as a tuple (a vector's too)."""
    if model.obs_shape is None:
        raise ValueError("policy.model.obs_shape must be filled in from the env first")
    shape = model.obs_shape
    return (shape,) if isinstance(shape, int) else tuple(shape)


def to_dict(config: JobConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)
