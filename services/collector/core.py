"""The collector's work: `collect` and `evaluate` tasks. No Flask.

One module on purpose (over 600 lines): the task loops (transitions, unrolls, rounds,
an evaluation) side by side, each a page, since they differ in what they build from
the same steps; the parts they share are modules of their own (below).

A collect task steps a vector env with the newest policy (reloaded only when the
coordinator's version changes), turns steps into n-step transitions, and hands them,
in chunks of at least `n_sample`, to the uploader thread, which writes what has queued
up as one segment to the shared store and inserts its reference. Stepping continues
while a segment uploads;
when the rate limiter says wait, the uploader waits and the queue fills, which
slows stepping down: the faster side waits, and no data is dropped.

`CollectorRunner`, here, runs a task's loop (`transitions`, `unrolls`, `rounds`, or an
evaluation); the parts its loops share are modules of this package:

| module | keeps |
|---|---|
| `follower.py` | the actor kept at the newest policy version (`PolicyFollower`) |
| `uploader.py` | segments written and inserted on their own thread (`SegmentUploader`) |
| `stepping.py` | the envs stepped in turn with the policy, or double-buffered |
| `step_data.py` | steps as segment columns: n-step transitions, a round with its GAE |
| `metrics.py` | what a collector counts for Prometheus (`CollectorMetrics`) |
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from algorithms.base import Actor, RecurrentActor, SamplingActor, TransitionActor
from common.advantages import DISCOUNTED_RETURN, DiscountedReturns
from common.checkpoint_file import read_checkpoint
from common.config import EnvConfig, JobConfig
from common.devices import acting_device, local_cuda
from common.envs import make_env
from common.messages import CollectSpec, EvalResult, EvaluateSpec, SegmentRef, dump
from common.storage import SharedStore
from common.video import CannotRender, VideoWriter, record_episode, video_path
from jobconfig import algorithm_of, insert_rows_bound, read_job_config
from services.collector.battle import BattleLoop, battle_evaluation
from services.collector.follower import PolicyFollower
from services.collector.metrics import CollectorMetrics
from services.collector.step_data import (
    ROUND_COLUMNS,
    VERSION,
    EpisodeRows,
    EpisodeTracker,
    NStepBuilder,
    as_obs,
    ended_values,
    next_values,
    round_columns,
)
from services.collector.stepping import make_stepper
from services.collector.uploader import (
    MAX_UPLOAD_ROWS,
    UPLOAD_WAIT_S,
    PendingSegment,
    SegmentUploader,
)
from services.slave.core import TaskContext

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Actor)
#: The envs a sampling loop steps: a vector env or a stepper.
E = TypeVar("E")


@functools.cache
def cuda_here() -> int:
    """CUDA devices this collector's torch can use (asked once)."""
    return local_cuda()[0]


def make_actor(config: JobConfig, protocol: type[A]) -> A:
    """The acting side of the job's algorithm, as the loop that will call it needs it,
    on the device this collector acts on for the job (`acting_device`).

    Raises:
        TypeError: the algorithm's actor lacks what this loop calls (its collect unit
            and the task's loop disagree).
    """
    policy = config.policy
    device = acting_device(policy, cuda_here())
    if device != policy.torch_device:
        policy = dataclasses.replace(policy, device=device)
    actor = algorithm_of(config).make_actor(policy)
    if not isinstance(actor, protocol):
        raise TypeError(f"{config.policy.type}'s actor is no {protocol.__name__}")
    return actor


#: The transitions loop hands the uploader its rows at most this often (once there are
#: `n_sample`; at once when an upload's worth is ready): making rows costs per call, and
#: the uploader gathers what comes within its `wait_s` into one segment anyway.
TAKE_EVERY_S = 0.05
#: How long the transitions loop's rows wait for others to share their upload. Each
#: upload (a file, its fsyncs, an insert request) costs the uploader thread milliseconds
#: of CPU, much of it Python under the interpreter lock, which the stepping thread waits
#: out; replayed rows lose nothing by reaching the buffer 0.2 s later. Under a rate
#: limiter an upload fills to its bound far sooner than this.
TRANSITIONS_UPLOAD_WAIT_S = 0.2


#: What the unrolls loop records at each step (an unroll's `bootstrap_obs` is once a
#: row); `done` is any episode end, `truncated` a time limit's only.
UNROLL_STEP_COLUMNS = ("obs", "action", "reward", "logp", "done", "truncated", "final_obs")


def actor_columns(config: JobConfig) -> tuple[str, ...]:
    """The columns the job's algorithm declares that its actor records."""
    return tuple(c.name for c in algorithm_of(config).columns_for(config.policy) if c.from_actor)


def recorded(policy: Actor, names: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """The actor's own columns (`names`) for the batch it just acted on."""
    if not names:
        return ()
    values = policy.recorded()  # type: ignore[attr-defined]  # a RecordingActor
    missing = [name for name in names if name not in values]
    if missing:
        raise RuntimeError(
            f"the actor recorded no {', '.join(missing)}, which its algorithm declares"
        )
    return tuple(np.asarray(values[name]) for name in names)


def wait_for_newer(
    ctx: TaskContext,
    policy: Actor,
    follower: PolicyFollower,
    uploader: SegmentUploader,
    after: int,
) -> bool:
    """Wait until the actor holds a version newer than `after` (a round's version:
    no step is taken with an older one); False when the task was stopped meanwhile."""
    while not ctx.stopped() and not (policy.loaded and policy.version > after):
        uploader.raise_if_failed()
        follower.wait_newer(timeout_s=1.0)
    return not ctx.stopped()


def declared_only(config: JobConfig, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A segment's columns: the ones the job's algorithm declares, and no others (the
    learner checks each of them; a loop may compute more than one algorithm reads)."""
    declared = algorithm_of(config).column_names_for(config.policy)
    missing = [name for name in declared if name not in columns]
    if missing:
        raise RuntimeError(f"this collect loop writes no {', '.join(missing)}")
    return {name: columns[name] for name in declared}


class CollectorRunner:
    """Runs `collect` and `evaluate` tasks (the TaskRunner of a collector)."""

    kinds = frozenset({"collect", "evaluate"})

    def __init__(self, store: SharedStore, *, metrics: CollectorMetrics | None = None) -> None:
        self.store = store
        #: Counted in the service's registry (a private one when None: tests).
        self.metrics = metrics or CollectorMetrics(CollectorRegistry())

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        config = read_job_config(self.store, ctx.task.job_id)
        torch.set_num_threads(config.system.torch_num_threads)
        spec = ctx.task.spec
        if not isinstance(spec, CollectSpec):
            return self.evaluate(ctx, config, spec)
        # The task says which loop: the coordinator's workflow chose it.
        loops = {
            "transitions": self.collect,
            "unrolls": self.collect_unrolls,
            "rounds": self.collect_rounds,
            "battle": self.collect_battle,
        }
        return loops[spec.mode](ctx, config, spec)

    def _uploader(
        self, ctx: TaskContext, config: JobConfig, wait_s: float = UPLOAD_WAIT_S
    ) -> SegmentUploader:
        """The task's uploader: uploads grow to MAX_UPLOAD_ROWS, or, under a rate
        limiter, to the most one insert is always let through; `wait_s` as
        SegmentUploader's."""
        bound = insert_rows_bound(config)
        return SegmentUploader(
            ctx,
            self.store,
            config.policy.collect.insert_timeout_s,
            max_rows=MAX_UPLOAD_ROWS if bound is None else min(bound, MAX_UPLOAD_ROWS),
            wait_s=wait_s,
            metrics=self.metrics,
            storage_grace_s=config.system.storage_grace_s,
        )

    def _sampling_rig(
        self,
        ctx: TaskContext,
        config: JobConfig,
        spec: CollectSpec,
        make_envs: Callable[[EnvConfig, int], E],
        upload_wait_s: float = UPLOAD_WAIT_S,
    ) -> tuple[SamplingActor, PolicyFollower, E, SegmentUploader, str]:
        """What the unrolls and rounds loops act with: the policy and its follower, the
        envs `make_envs` makes, the uploader (`upload_wait_s`: SegmentUploader's
        `wait_s`), and this task's segment folder. The envs come before the uploader's
        thread, so envs that cannot be made leave nothing running."""
        policy_cfg = config.policy
        policy = make_actor(config, SamplingActor)
        follower = PolicyFollower(
            policy,
            self.store,
            ctx.coordinator,
            ctx.task.job_id,
            policy_cfg.collect.policy_poll_s,
            policy_cfg.type,
        )
        torch.manual_seed(spec.seed)
        envs = make_envs(config.env, spec.num_envs)
        uploader = self._uploader(ctx, config, upload_wait_s)
        return policy, follower, envs, uploader, f"{ctx.worker_id}.{ctx.task.task_id}"

    def _ship(
        self,
        ctx: TaskContext,
        uploader: SegmentUploader,
        episodes: EpisodeTracker,
        columns: dict[str, np.ndarray],
        worker_dir: str,
        seq: int,
        version: int,
        *,
        env_steps: int,
        total_env_steps: int,
        started: float,
    ) -> int:
        """Queue one segment (with the episodes it finished) and report progress;
        returns the env steps it covers."""
        returns, lengths = episodes.take()
        ref = SegmentRef(
            path=self.store.segment_path(ctx.task.job_id, worker_dir, seq),
            rows=len(columns["obs"]),
            env_steps=env_steps,
            policy_version=version,
            episode_returns=returns,
            episode_lengths=lengths,
        )
        uploader.put(PendingSegment(columns=columns, ref=ref))
        self.metrics.env_steps.inc(env_steps)
        total = total_env_steps + env_steps
        ctx.progress.update(
            env_steps=total,
            env_steps_per_s=round(total / max(time.monotonic() - started, 1e-9), 1),
            policy_version=version,
            rows_acknowledged=uploader.rows_acknowledged,
        )
        return env_steps

    def collect_unrolls(
        self, ctx: TaskContext, config: JobConfig, spec: CollectSpec
    ) -> dict[str, Any]:
        """The unrolls loop (IMPALA): act with the newest version, and every
        `unroll_len` steps send one unroll per env, with the behaviour
        log-probabilities V-trace needs.

        Each step also records whether a time limit cut the episode there
        (`truncated`; a termination at the same step wins: it is terminal) and the
        observation it ended on (`final_obs`, the next step's `obs` where no episode
        ended): the learner bootstraps a truncation from that observation's value, as
        PPO's GAE does. `final_obs` is kept at every step because a column has one
        shape a row; image frames are pooled, so it costs images only their indexes.
        """
        policy_cfg = config.policy
        policy, follower, stepper, uploader, worker_dir = self._sampling_rig(
            ctx, config, spec, make_stepper
        )
        own = actor_columns(config)
        stepper.reset(seed=spec.seed)
        episodes = EpisodeTracker(spec.num_envs)
        env_steps = seq = 0
        started = time.monotonic()

        def act(obs: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
            action, logp, _ = policy.sample(obs)
            return policy.env_action(action), (action, logp, *recorded(policy, own))

        try:
            while not ctx.stopped():
                follower.refresh()
                if not policy.loaded:  # the learner publishes its first version at start
                    uploader.raise_if_failed()
                    follower.wait_newer(timeout_s=1.0)
                    continue
                version = policy.version
                record: dict[str, list] = {k: [] for k in (*UNROLL_STEP_COLUMNS, *own)}
                for _ in range(policy_cfg.collect.unroll_len):
                    obs, (action, logp, *extra), step = stepper.step_with(act)
                    for key, item in zip(own, extra, strict=True):
                        record[key].append(item)
                    for key, item in (
                        ("obs", obs),
                        ("action", action),
                        ("reward", step.reward),
                        ("logp", logp),
                        ("done", step.ended),
                        ("truncated", step.truncated & ~step.terminated),
                        ("final_obs", step.final_obs),
                    ):
                        record[key].append(item)
                    episodes.step(step.reward, step.ended)
                # [T, envs, ...] -> one unroll per env: [envs, T, ...]
                columns = {k: np.stack(v, axis=1) for k, v in record.items()}
                for key in ("obs", "final_obs"):
                    columns[key] = as_obs(columns[key])
                for key in ("reward", "logp", "done", "truncated", *own):
                    columns[key] = columns[key].astype(np.float32)
                action = columns["action"]
                columns["action"] = action.astype(
                    np.int64 if action.dtype.kind in "iu" else np.float32
                )
                columns["bootstrap_obs"] = as_obs(stepper.obs)
                # One item per env; each covers unroll_len env steps.
                env_steps += self._ship(
                    ctx,
                    uploader,
                    episodes,
                    declared_only(config, columns),
                    worker_dir,
                    seq,
                    version,
                    env_steps=spec.num_envs * policy_cfg.collect.unroll_len,
                    total_env_steps=env_steps,
                    started=started,
                )
                seq += 1
        finally:
            uploader.close()
            stepper.close()
        return {"env_steps": env_steps, "segments": uploader.segments_sent}

    def collect_rounds(
        self, ctx: TaskContext, config: JobConfig, spec: CollectSpec
    ) -> dict[str, Any]:
        """The sync workflow: for each policy version v, collect exactly this
        collector's share of the round with v, compute GAE with v's critic, insert
        it, then wait for v + 1. No step is ever taken with an older version."""
        policy_cfg = config.policy
        # The learner waits for each round: it goes as soon as it is collected.
        policy, follower, env, uploader, worker_dir = self._sampling_rig(
            ctx, config, spec, make_env, upload_wait_s=0.0
        )
        round_steps = spec.round_steps or policy_cfg.collect.n_sample
        steps = -(-round_steps // spec.num_envs)  # vector steps per round, rounded up
        obs = env.reset(seed=spec.seed)
        own = actor_columns(config)
        episodes = EpisodeTracker(spec.num_envs)
        # Across rounds, as an episode can be: a job that normalizes rewards ships them.
        returns = DiscountedReturns(spec.num_envs, policy_cfg.discount_factor)
        last_version, env_steps, seq = 0, 0, 0
        started = time.monotonic()
        try:
            while wait_for_newer(ctx, policy, follower, uploader, last_version):
                version = policy.version
                record: dict[str, list] = {k: [] for k in (*ROUND_COLUMNS, DISCOUNTED_RETURN, *own)}
                for _ in range(steps):
                    action, logp, value = policy.sample(obs)
                    for key, item in zip(own, recorded(policy, own), strict=True):
                        record[key].append(item)
                    step = env.step(policy.env_action(action))
                    for key, item in (
                        ("obs", obs),
                        ("action", action),
                        ("logp", logp),
                        ("value", value),
                        ("reward", step.reward),
                        ("terminated", step.terminated),
                        ("ended", step.ended),
                        ("next_value", ended_values(policy, step)),
                        (DISCOUNTED_RETURN, returns.step(step.reward, step.ended)),
                    ):
                        record[key].append(item)
                    episodes.step(step.reward, step.ended)
                    obs = step.obs
                # Where no episode ended, the next state's value is the one `sample`
                # gave at the next step; after the round's last step, one more pass.
                record["next_value"] = next_values(
                    record["value"], record["ended"], record["next_value"], policy.value(obs)
                )
                # Divided by this version's return spread where the job normalizes
                # rewards, once a round; the episodes' returns stay the env's own.
                record["reward"] = policy.scale_rewards(np.asarray(record["reward"]))
                columns = declared_only(config, round_columns(record, policy_cfg))
                env_steps += self._ship(
                    ctx,
                    uploader,
                    episodes,
                    columns,
                    worker_dir,
                    seq,
                    version,
                    env_steps=len(columns["obs"]),
                    total_env_steps=env_steps,
                    started=started,
                )
                seq += 1
                last_version = version
        finally:
            uploader.close()
            env.close()
        return {"env_steps": env_steps, "segments": uploader.segments_sent}

    def collect_battle(
        self, ctx: TaskContext, config: JobConfig, spec: CollectSpec
    ) -> dict[str, Any]:
        """The selfplay workflow: rounds of two-player games against the league's
        opponents (services/collector/battle.py)."""
        loop = BattleLoop(self, ctx, config, lambda: make_actor(config, SamplingActor))
        return loop.run(spec)

    def collect(self, ctx: TaskContext, config: JobConfig, spec: CollectSpec) -> dict[str, Any]:
        job_id = ctx.task.job_id
        policy_cfg = config.policy
        stepper = make_stepper(config.env, spec.num_envs)
        rng = np.random.default_rng(spec.seed)
        policy = make_actor(config, TransitionActor)
        follower = PolicyFollower(
            policy,
            self.store,
            ctx.coordinator,
            job_id,
            policy_cfg.collect.policy_poll_s,
            policy_cfg.type,
        )
        builder = NStepBuilder(
            spec.num_envs,
            policy_cfg.collect_nstep,  # type: ignore[attr-defined]  # a transitions config
            policy_cfg.discount_factor,
        )
        uploader = self._uploader(ctx, config, TRANSITIONS_UPLOAD_WAIT_S)
        # Episode and sequence items: rows go out grouped by episode, with their spans;
        # an episode cut into pieces repeats the rows consecutive sequences share at
        # each cut. A piece must hold more rows than it repeats: where the insert bound
        # is smaller, a piece of overlap + 1 rows is one sequence item, which any bound
        # admits.
        buffer = policy_cfg.other.replay_buffer
        grouped = buffer.item != "transition"
        episode_rows = (
            EpisodeRows(spec.num_envs, max(uploader.max_rows, buffer.overlap + 1), buffer.overlap)
            if grouped
            else None
        )
        recurrent = isinstance(policy, RecurrentActor)
        # Segment names carry this worker's id and the task's id, so two tasks (or a
        # task reassigned after a restart) never write the same file.
        worker_dir = f"{ctx.worker_id}.{ctx.task.task_id}"
        stepper.reset(seed=spec.seed)
        episodes = EpisodeTracker(spec.num_envs)
        env_steps = segment_steps = seq = 0
        counted_steps = 0  # env steps in the metrics' counter so far
        own = actor_columns(config)
        started = next_take_at = time.monotonic()

        def act(obs: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
            # Exploration follows the whole job's env steps, so adding collectors does
            # not slow its decay down.
            actions = policy.act(obs, rng, max(uploader.job_env_steps, env_steps))
            # Recorded with the step: double buffered, a half steps with the version
            # it acted with, which may be older than the one loaded when it returns.
            versions = np.full(len(obs), policy.version, np.int64)
            return policy.env_action(actions), (actions, versions, *recorded(policy, own))

        try:
            while not ctx.stopped():
                follower.refresh()
                job_env_steps = max(uploader.job_env_steps, env_steps)
                obs, (actions, versions, *extra), step = stepper.step_with(act)
                builder.add(
                    obs,
                    actions,
                    step.reward,
                    step.final_obs,
                    step.terminated,
                    step.truncated,
                    {VERSION: versions, **dict(zip(own, extra, strict=True))},
                )
                if recurrent:
                    policy.reset_state(step.ended)  # type: ignore[attr-defined]
                env_steps += spec.num_envs
                segment_steps += spec.num_envs
                # Episodes and the env step counter are counted at each take, from the
                # builder's columns: the stepping thread pays for every call it makes.
                in_episodes = len(episode_rows) if episode_rows is not None else 0
                # `begun` bounds the ready rows from above and costs nothing: the exact
                # count is asked for only when a take may be due.
                at_most = builder.begun + in_episodes
                if (
                    at_most >= policy_cfg.collect.n_sample
                    and (at_most >= uploader.max_rows or time.monotonic() >= next_take_at)
                    and len(builder) + in_episodes >= policy_cfg.collect.n_sample
                ):
                    next_take_at = time.monotonic() + TAKE_EVERY_S
                    episodes.steps(*builder.fresh_steps())
                    self.metrics.env_steps.inc(env_steps - counted_steps)
                    counted_steps = env_steps
                    spans: list[tuple[int, int]] = []
                    if episode_rows is None:
                        rows = builder.take()
                    else:
                        episode_rows.add(builder.take(where=True))
                        if len(episode_rows) < policy_cfg.collect.n_sample:
                            continue  # the rest are in episodes still going on
                        rows, spans = episode_rows.take(uploader.max_rows)
                    columns = declared_only(config, rows)
                    path = self.store.segment_path(job_id, worker_dir, seq)
                    returns, lengths = episodes.take()
                    ref = SegmentRef(
                        path=path,
                        rows=len(columns["obs"]),
                        env_steps=segment_steps,
                        # Its oldest row's: rows held until their episode ended may have
                        # been acted by versions before the one acting now, and
                        # staleness is judged by the oldest.
                        policy_version=int(rows[VERSION].min()),
                        episode_returns=returns,
                        episode_lengths=lengths,
                        episodes=spans,
                    )
                    uploader.put(PendingSegment(columns=columns, ref=ref))
                    seq += 1
                    segment_steps = 0
                    elapsed = time.monotonic() - started
                    stepping_s = max(elapsed - uploader.waited_s, 1e-9)
                    ctx.progress.update(
                        env_steps=env_steps,
                        env_steps_per_s=round(env_steps / max(elapsed, 1e-9), 1),
                        # what this collector does when the rate limiter lets it run
                        unthrottled_env_steps_per_s=round(env_steps / stepping_s, 1),
                        rows_acknowledged=uploader.rows_acknowledged,
                        policy_version=policy.version,
                        **policy.exploration(job_env_steps),
                    )
        finally:
            self.metrics.env_steps.inc(env_steps - counted_steps)
            uploader.close()
            stepper.close()
        return {"env_steps": env_steps, "segments": uploader.segments_sent}

    def _load_for_evaluation(self, policy: Actor, spec: EvaluateSpec, algo: str) -> None:
        """Random actions need nothing; a policy file or a checkpoint (safetensors
        both) is read from inside the shared root, and refused unless the job's
        algorithm `algo` wrote it.

        Raises:
            WrongAlgorithm: another algorithm wrote the file (the task fails with this,
                so the job ends failed with it).
        """
        if spec.source == "random":
            return  # an actor with no version loaded acts at random
        if spec.policy_path is None:
            raise ValueError(f"an evaluation of a {spec.source} needs policy_path")
        if spec.source == "policy":
            # The digest the learner announced: a file swapped since is refused.
            policy_file = self.store.read_policy(
                spec.policy_path, sha256=spec.policy_sha256, algo=algo
            )
            policy.load(spec.policy_version, policy_file.tensors)
            return
        checkpoint = read_checkpoint(self.store, spec.policy_path, algo=algo)
        policy.network.load_state_dict(checkpoint.model["online"])
        policy.version, policy.loaded = spec.policy_version, True

    def evaluate(self, ctx: TaskContext, config: JobConfig, spec: EvaluateSpec) -> dict[str, Any]:
        """Run `spec.episodes` greedy episodes of one policy version.

        Each env runs a fixed quota of episodes decided up front (differing by at most
        one), so envs with short episodes cannot crowd out long ones and bias the mean.
        """
        policy = make_actor(config, Actor)
        self._load_for_evaluation(policy, spec, config.policy.type)
        if spec.opponents:
            return battle_evaluation(ctx, config, spec, policy)
        num_envs = min(spec.num_envs, spec.episodes)
        quota = np.full(num_envs, spec.episodes // num_envs)
        quota[: spec.episodes % num_envs] += 1
        # Whole games with unclipped rewards: the score a user compares with papers.
        env = make_env(config.env, num_envs, training=False)
        rng = np.random.default_rng(spec.seed)
        obs = env.reset(seed=spec.seed)
        episodes = EpisodeTracker(num_envs)
        done_count = np.zeros(num_envs, dtype=np.int64)
        returns: list[float] = []
        lengths: list[int] = []
        try:
            recurrent = isinstance(policy, RecurrentActor)
            while (done_count < quota).any() and not ctx.stopped():
                step = env.step(policy.greedy(obs, rng))
                obs = step.obs
                if recurrent:
                    policy.reset_state(step.ended)  # type: ignore[attr-defined]
                for i, ret, length in episodes.step(step.reward, step.ended):
                    if done_count[i] < quota[i]:  # each env's quota was fixed up front
                        returns.append(ret)
                        lengths.append(length)
                        done_count[i] += 1
                ctx.progress["episodes"] = len(returns)
        finally:
            env.close()
        result = EvalResult(policy_version=spec.policy_version, returns=returns, lengths=lengths)
        if spec.video and returns and not ctx.stopped():
            result = self._record_video(ctx, config, spec, policy, result)
        return dump(result)

    def _record_video(
        self,
        ctx: TaskContext,
        config: JobConfig,
        spec: EvaluateSpec,
        policy: Any,
        result: EvalResult,
    ) -> EvalResult:
        """One more greedy episode of the version, rendered: an MP4 and the GIF that
        TensorBoard shows, in the job's `videos/`. An env that cannot render says why
        in the result; the evaluation counts all the same."""
        rng = np.random.default_rng(spec.seed)
        try:
            # Encoded as it is rendered: a long episode's frames are never all held.
            with VideoWriter(("mp4", "gif")) as video:
                record_episode(
                    config.env,
                    lambda obs: policy.greedy(obs, rng),
                    spec.seed,
                    stop=ctx.stopped,
                    sink=video,
                )
            name = video_path(ctx.task.job_id, spec.policy_version)
            for fmt in ("mp4", "gif"):
                self.store.write_bytes(f"{name}.{fmt}", video.data[fmt])
        except CannotRender as exc:
            log.warning("no video of job %s: %s", ctx.task.job_id, exc)
            return dataclasses.replace(result, video_error=str(exc)[:500])
        except Exception as exc:  # a full volume, an encoder error: the returns count
            log.exception("no video of job %s", ctx.task.job_id)
            why = f"the video failed: {type(exc).__name__}: {exc}"
            return dataclasses.replace(result, video_error=why[:500])
        return dataclasses.replace(result, video=f"{name}.mp4", video_gif=f"{name}.gif")
