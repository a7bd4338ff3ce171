"""Typed messages exchanged between drover services.

Every HTTP body is one of these frozen dataclasses. `parse` turns a JSON value into
one (validating types and bounds, so a bad field becomes a 400 naming it) and `dump`
turns one back into plain JSON data. Bulk data never travels in a message: segments
and policies are referenced by their path relative to the shared root.

One module on purpose (over 1,100 lines, most of them field declarations and the
comments that bound them): the catalogue of every message the services
exchange, each a dataclass of fields (with its body limit, for one a route takes), the
bounds and field types they are declared with (a bound several messages share, such
as MAX_SAMPLE_ITEMS, is stated once beside them), and the `parse` and `dump` that read
and write any of them. A route and the message it takes or answers are found in one
place, by section: workers, tasks, the data plane, jobs, small answers.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from annotated_types import Ge, Gt, Le, MaxLen, MinLen
from pydantic import ConfigDict, FailFast, Field, TypeAdapter, ValidationError, with_config

T = TypeVar("T")

TaskKind = Literal["collect", "evaluate", "learn"]
WorkerRole = Literal["collector", "learner"]
#: queued: admitted, waiting for a place among the coordinator's running jobs
#: (`DROVER_MAX_RUNNING_JOBS`).
JobPhase = Literal["queued", "running", "succeeded", "failed", "stopped"]
TERMINAL_PHASES: frozenset[str] = frozenset({"succeeded", "failed", "stopped"})

# Bounds shared by the routes: generous for real use, small enough that one request
# cannot exhaust a server.
#: Buffer processes one job's replay may be split over (`replay_buffer.shards`).
MAX_SHARDS = 16
MAX_BATCH_SIZE = 8192
MAX_NUM_BATCHES = 256
MAX_WAIT_S = 60.0
MAX_SEGMENTS_PER_INSERT = 256
#: Items one sample request may take (batch_size x num_batches): three such replies
#: must not cost a server much memory.
MAX_SAMPLE_ITEMS = 65_536
#: A learner sends one priority update for each sample reply it trained on.
MAX_KEYS_PER_UPDATE = MAX_SAMPLE_ITEMS
#: Priorities above this are refused: one huge value would pin the sampler's maximum
#: (which every new item gets) for the rest of the job. Learners clip to it.
MAX_PRIORITY = 1e6
#: Policy versions and other counters stored as int32 columns.
MAX_INT32 = 2**31 - 1
#: Rows of one segment file; env steps and episode lengths of one segment.
MAX_SEGMENT_ROWS = 1 << 20
#: Episodes one segment reference lists. A collector sends the last ones that ended
#: (the coordinator keeps only the last 100 returns of a job), so an insert of
#: MAX_SEGMENTS_PER_INSERT references stays a body of a few MiB.
MAX_EPISODES_PER_SEGMENT = 1024
#: Tasks one heartbeat reports: a worker runs at most one task of each kind.
MAX_TASKS_PER_HEARTBEAT = 8
#: Episodes one evaluation result reports.
MAX_EVAL_EPISODES = 100_000
#: Returns, losses and other reported floats: finite, and within this magnitude.
MAX_ABS_FLOAT = 1e15

NonNegInt = Annotated[int, Ge(0)]
PosInt = Annotated[int, Gt(0)]
#: Counters kept as int32 columns (policy versions) or summed into int64 ones.
Version = Annotated[int, Ge(0), Le(MAX_INT32)]
Count = Annotated[int, Ge(0), Le(2**53)]
SegmentRows = Annotated[int, Gt(0), Le(MAX_SEGMENT_ROWS)]
SegmentCount = Annotated[int, Ge(0), Le(MAX_SEGMENT_ROWS)]
#: A reported number (returns, losses, progress): finite (NaN and inf are refused for
#: every float by MESSAGE_CONFIG) and of a magnitude any sum of them can hold.
Number = Annotated[float, Ge(-MAX_ABS_FLOAT), Le(MAX_ABS_FLOAT)]
ItemKey = Annotated[int, Ge(0), Le(2**63 - 1)]
Priority = Annotated[float, Ge(0), Le(MAX_PRIORITY)]
ShortText = Annotated[str, MaxLen(256)]
#: What a worker offers (its devices, cores): a few named scalars.
Resources = Annotated[
    dict[Annotated[str, MinLen(1), MaxLen(64)], ShortText | Count | Number | bool | None],
    MaxLen(32),
]
#: A worker's progress report: a few named numbers.
Progress = Annotated[dict[Annotated[str, MinLen(1), MaxLen(64)], Number], MaxLen(64)]
WaitSeconds = Annotated[float, Ge(0), Le(MAX_WAIT_S)]
RelPath = Annotated[str, MinLen(1), MaxLen(1024)]
Ident = Annotated[str, MinLen(1), MaxLen(128)]
#: Episodes listed in one segment reference. FailFast: a list of bad values costs
#: one validation error, not one each.
EpisodeList = Annotated[list[T], FailFast(), MaxLen(MAX_EPISODES_PER_SEGMENT)]

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class BodyLimit:
    """The most a request body carrying one message may hold.

    Every message a route takes declares one (`body_limit`), sized for the largest
    legitimate body. A body over `max_bytes` is refused from its Content-Length,
    before it is read; one with more arrays, objects, values, keys or nesting than
    the message can hold is refused by a scan of its bytes, before any object is
    built (common/http.py): parsing builds an object for each, and validation an
    error for each bad one, so a few MiB of `{}` would otherwise cost a server a GiB.

    The scan counts bytes, so a `{`, `[`, `,` or `:` inside a string counts too: the
    counts are upper bounds, and the limits are generous for that reason.
    """

    max_bytes: int
    #: Objects and arrays, the body's own object included (`{` and `[` bytes).
    max_containers: int
    #: Values after the first of each array and object (`,` bytes).
    max_values: int
    #: Keys of all its objects (`:` bytes): each unknown one would be an error.
    max_keys: int
    #: Levels of arrays and objects inside one another, the body's own object included.
    max_depth: int


class MessageError(ValueError):
    """A message did not match its schema; `field` is a dotted path into it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


# strict: a JSON string is never silently turned into a number (int -> float is still
# accepted, as JSON writers produce it freely); extra: an unknown field is an error.
MESSAGE_CONFIG = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


def message(cls: type[T]) -> type[T]:
    """Declare a message: a frozen, keyword-only dataclass validated strictly."""
    return with_config(MESSAGE_CONFIG)(dataclass(frozen=True, kw_only=True)(cls))


def new_id(prefix: str) -> str:
    """A fresh id such as ``job-3f2a9c01b7e4`` (safe as a folder name)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def bulk_message(cls: type[T]) -> type[T]:
    """A message built hundreds of times per request (sample replies): slotted and not
    frozen, which halves the cost of creating one. Treat it as read-only all the same."""
    return with_config(MESSAGE_CONFIG)(dataclass(kw_only=True, slots=True)(cls))


@cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def parse(cls: type[T], data: Any) -> T:
    """Validate a JSON document (bytes/str) or plain JSON data into the dataclass `cls`.

    Raises:
        MessageError: naming the first offending field, e.g. ``segments.0.rows``.
    """
    # Strict validation runs in JSON mode, where objects map onto dataclasses.
    raw = data if isinstance(data, bytes | str) else json.dumps(data)
    try:
        return _adapter(cls).validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise MessageError(loc, first["msg"]) from None


def dump_json(obj: Any) -> bytes:
    """A message as JSON bytes, serialized by pydantic's compiled encoder (much
    faster than `dataclasses.asdict` + `json.dumps` for large samples)."""
    return _adapter(type(obj)).dump_json(obj)


def dump(obj: Any) -> Any:
    """Plain JSON data for a message (dataclasses become dicts)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, list):
        return [dump(o) for o in obj]
    return obj


# --- workers ---------------------------------------------------------------------


@message
class WorkerRegistration:
    role: WorkerRole
    #: Where the coordinator reaches this worker: http(s)://host[:port], checked.
    url: Annotated[str, MinLen(1), MaxLen(512)]
    #: The secret the coordinator sends to this worker's routes (`Authorization:
    #: Bearer`): the worker's own, so the cluster token never leaves the coordinator.
    slave_token: Annotated[str, MinLen(32), MaxLen(256)]
    #: What the worker offers: slaves report `cuda_devices` (0: none) and `cpu_count`
    #: (common/devices.py); a job on CUDA runs only on workers with CUDA devices.
    resources: Resources = field(default_factory=dict)

    #: Every field at its bound in ASCII is about 11 KiB.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=16 * KIB, max_containers=64, max_values=512, max_keys=256, max_depth=2
    )


@message
class Registered:
    worker_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    #: This worker's own bearer credential for everything after registering: with it,
    #: it can act only as itself (its heartbeats, its tasks, its segment folder).
    credential: str


@message
class TaskProgress:
    task_id: Ident
    state: Literal["running", "done", "failed"]
    progress: Progress = field(default_factory=dict)
    #: Segment files the task could not use (corrupt, truncated, missing columns).
    unusable_segments: Annotated[list[RelPath], MaxLen(100)] = field(default_factory=list)


@message
class Heartbeat:
    tasks: Annotated[list[TaskProgress], MaxLen(MAX_TASKS_PER_HEARTBEAT)] = field(
        default_factory=list
    )

    #: Every field at its bound in ASCII is about 870 KiB (mostly the unusable paths).
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=MIB, max_containers=256, max_values=4096, max_keys=1024, max_depth=4
    )


@message
class HeartbeatReply:
    #: Tasks to stop at once: what is in flight is dropped.
    cancel: list[str]
    #: Tasks to end at their next safe point (a segment boundary, a checkpoint), what
    #: they did handed in, and then report complete: their worker goes to another job.
    release: list[str] = field(default_factory=list)
    #: A fresh credential for each of its tasks whose data goes to a buffer process
    #: (by task id): credentials expire (`DROVER_CREDENTIAL_TTL_S`), and a restarted
    #: buffer process takes only those signed after it started.
    credentials: dict[str, str] = field(default_factory=dict)


@message
class WorkerInfo:
    worker_id: str
    role: str
    url: str
    state: Literal["idle", "busy"]
    task_id: str | None
    task_ids: list[str]
    last_heartbeat_s: float
    #: The last progress each running task reported, by task id.
    progress: dict[str, dict[str, float]] = field(default_factory=dict)
    #: What it reported at registration (`WorkerRegistration.resources`).
    resources: Resources = field(default_factory=dict)
    #: The job of each of its tasks, by task id.
    jobs: dict[str, str] = field(default_factory=dict)
    #: Seconds before it is given a new task (0: it may be now): it lost tasks, or
    #: failed to take them, in a row (`lost_tasks`, `WorkerRegistry.lost`).
    held_back_s: float = 0.0
    #: Tasks in a row it lost: never confirmed, or missing from its heartbeats.
    lost_tasks: int = 0


# --- tasks -----------------------------------------------------------------------


@message
class DataAccess:
    """Where a task's data goes: the buffer processes serving its job's replay, one a
    shard (services/buffer/sharding.py), and the credential that lets this task, and
    only it, insert or sample there (for a job whose buffer the coordinator hosts
    itself, a task has none: it uses the coordinator's routes with its worker's
    credential)."""

    urls: Annotated[list[Annotated[str, MinLen(1), MaxLen(512)]], MinLen(1), MaxLen(MAX_SHARDS)]
    credential: Annotated[str, MinLen(1), MaxLen(512)]


@message
class CollectSpec:
    kind: Literal["collect"] = "collect"
    seed: Count
    num_envs: PosInt
    #: The loop the collector runs: n-step transitions, fixed-length unrolls, or
    #: rounds of exactly `round_steps` env steps with one policy version.
    #: `battle`: rounds of two-player games against opponents the league draws.
    mode: Literal["transitions", "unrolls", "rounds", "battle"] = "transitions"
    #: Rounds: env steps this collector contributes to each round.
    round_steps: PosInt | None = None
    #: Where its segments are inserted: its job's buffer processes (the coordinator
    #: sets it for every collect task of a job that replays).
    data: DataAccess | None = None


#: A fixed opponent of a game (common/games.py): a self-play league's baselines.
BaselineName = Literal["random", "heuristic"]
#: Games of one battle evaluation against each baseline, both seats together.
MAX_BATTLE_GAMES = 10_000


@message
class EvaluateSpec:
    kind: Literal["evaluate"] = "evaluate"
    seed: Count
    num_envs: PosInt
    episodes: PosInt
    #: A battle evaluation (two-player games): `episodes` games against each of these,
    #: half on each seat. Empty: single-agent episodes.
    opponents: Annotated[list[BaselineName], MaxLen(2)] = field(default_factory=list)
    #: What acts: a policy file, a learner checkpoint (its online network), or random.
    source: Literal["policy", "checkpoint", "random"] = "policy"
    policy_version: Version = 0
    policy_path: RelPath | None = None
    #: The policy file's digest as announced: the evaluator checks the file against it.
    policy_sha256: Annotated[str, MinLen(64), MaxLen(64)] | None = None
    #: Record one more greedy episode as a video (`policy.eval.video_every`).
    video: bool = False


@message
class LearnSpec:
    kind: Literal["learn"] = "learn"
    seed: Count
    #: Batches sampled as they come, or whole on-policy rounds (one version each).
    mode: Literal["batches", "rounds"] = "batches"
    #: Where it samples and sends priorities: its job's buffer processes (the
    #: coordinator sets it for every learn task).
    data: DataAccess | None = None
    #: The learn lease's epoch: each learn task of a job gets a higher one, its files
    #: and announcements carry it, and the coordinator refuses one below the job's
    #: newest (docs/architecture.md, "Fencing").
    epoch: Count = 0


#: What a task runs, told apart by its `kind`.
TaskSpec = Annotated[CollectSpec | EvaluateSpec | LearnSpec, Field(discriminator="kind")]


@message
class TaskAssignment:
    task_id: Ident
    job_id: Ident
    spec: TaskSpec

    #: Every field at its bound in ASCII is under 2 KiB; a task's data access is the
    #: deepest part (body, spec, data, its shards' addresses).
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=16 * KIB, max_containers=64, max_values=256, max_keys=64, max_depth=4
    )

    @property
    def kind(self) -> TaskKind:
        return self.spec.kind


@message
class GameTally:
    """Games of one side against one opponent."""

    wins: Count = 0
    draws: Count = 0
    losses: Count = 0


def win_rate(wins: int, draws: int, losses: int) -> float | None:
    """A side's score per game, draws counting half: (wins + draws / 2) / games; None
    before any game. The one definition: the league's payoff table, the battle
    evaluations (and `league.stop.win_rate`) and `drover plot` all count with it."""
    games = wins + draws + losses
    if games == 0:
        return None
    return (wins + draws / 2) / games


@message
class EvalResult:
    policy_version: Version
    returns: Annotated[list[Number], FailFast(), MinLen(1), MaxLen(MAX_EVAL_EPISODES)]
    lengths: Annotated[list[Count], FailFast(), MaxLen(MAX_EVAL_EPISODES)]
    #: A battle evaluation: the games against each baseline (its `returns` are the
    #: games' outcomes, 1 a win, 0 a draw, -1 a loss).
    tallies: Annotated[dict[BaselineName, GameTally], MaxLen(2)] | None = None
    #: Its video (`EvaluateSpec.video`): the MP4 and the GIF TensorBoard shows, under
    #: the job's `videos/`; or why the env gave none.
    video: RelPath | None = None
    video_gif: RelPath | None = None
    video_error: Annotated[str, MaxLen(500)] = ""


@message
class TaskComplete:
    result: dict[str, Any] = field(default_factory=dict)

    #: The largest result is an EvalResult of MAX_EVAL_EPISODES returns and lengths:
    #: about 3.3 MiB with every return at full precision.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=4 * MIB,
        max_containers=64,
        max_values=2 * MAX_EVAL_EPISODES + 256,
        max_keys=256,
        max_depth=4,
    )


@message
class TaskFail:
    error: Annotated[str, MaxLen(4096)]

    #: 4,096 characters at their worst as JSON (12 bytes for an emoji, `\ud83d\ude00`);
    #: a traceback may hold a bracket, a comma or a colon in every character.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=64 * KIB,
        max_containers=4096 + 8,
        max_values=4096 + 8,
        max_keys=4096 + 8,
        max_depth=1,
    )


# --- data plane ------------------------------------------------------------------


@message
class SegmentRef:
    """A step-data file written by a collector, and what it holds."""

    path: RelPath
    #: Items in the file: checked against the file's own header on insert.
    rows: SegmentRows
    env_steps: SegmentCount
    policy_version: Version
    #: Returns and lengths of the (last) episodes that ended in the segment.
    episode_returns: EpisodeList[Number] = field(default_factory=list)
    episode_lengths: EpisodeList[Count] = field(default_factory=list)
    #: For episode buffers: (first row, length) of each whole episode in the segment.
    episodes: EpisodeList[tuple[SegmentCount, SegmentRows]] = field(default_factory=list)


@message
class SegmentInsert:
    segments: Annotated[list[SegmentRef], FailFast(), MinLen(1), MaxLen(MAX_SEGMENTS_PER_INSERT)]
    # How long the insert may wait for the rate limiter before answering 429.
    timeout_s: WaitSeconds = 0.0
    # The collect task that wrote the segments: refused once that task was reassigned
    # (a worker back from a lost lease). Tools inserting by hand may leave it out.
    task_id: Ident | None = None

    #: MAX_SEGMENTS_PER_INSERT references with 1 KiB paths and 100 episodes each (at
    #: full precision) are about 1.9 MiB; one reference at every bound, about 64 KiB.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=2 * MIB,
        max_containers=MAX_SEGMENTS_PER_INSERT * 128,
        max_values=MAX_SEGMENTS_PER_INSERT * 512,
        max_keys=MAX_SEGMENTS_PER_INSERT * 8 + 8,
        max_depth=5,
    )


@message
class InsertReply:
    accepted: int
    duplicates: int
    env_steps: int


@message
class SampleRequest:
    """`batch_size` x `num_batches` is at most MAX_SAMPLE_ITEMS. A learner names its
    learn task: items of a consuming (fifo) buffer are then held for that task until
    it acknowledges them with a later request, and go back to the buffer if the task
    ends first (a crashed or cancelled learner loses nothing)."""

    batch_size: Annotated[int, Gt(0), Le(MAX_BATCH_SIZE)]
    num_batches: Annotated[int, Gt(0), Le(MAX_NUM_BATCHES)] = 1
    timeout_s: WaitSeconds = 10.0
    task_id: Ident | None = None
    #: Holds (`SampleReply.hold_id`) whose items this learner has trained on.
    acknowledge: Annotated[list[Ident], MaxLen(64)] = field(default_factory=list)
    #: Holds whose items this learner will not train on: they go back to the queue
    #: before the draw (a draw over shards that failed on one shard returns the
    #: parts the others drew).
    give_back: Annotated[list[Ident], MaxLen(64)] = field(default_factory=list)
    #: New priorities of items this learner has trained on (a prioritized buffer), by
    #: key: applied before the sample is drawn, as a `PriorityUpdate` would apply them,
    #: so that a learner sends them with its next request, not in one of their own.
    priority_keys: Annotated[list[ItemKey], FailFast(), MaxLen(MAX_KEYS_PER_UPDATE)] = field(
        default_factory=list
    )
    priorities: Annotated[list[Priority], FailFast(), MaxLen(MAX_KEYS_PER_UPDATE)] = field(
        default_factory=list
    )
    #: A shard's part of a draw over a job's shards (services/buffer/sharding.py):
    #: exactly this many items, as one batch; `batch_size` x `num_batches` is then the
    #: whole draw's (its batches count toward annealing as in one table). 0: none,
    #: at once; the reply still says the shard's mass (and the priorities apply).
    items: Annotated[int, Ge(0), Le(MAX_SAMPLE_ITEMS)] | None = None

    #: Every field at its bound in ASCII is about 8.5 KiB, and the priorities as much
    #: as a `PriorityUpdate`'s (about 2.9 MiB).
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=4 * MIB + 16 * KIB,
        max_containers=8,
        max_values=2 * MAX_KEYS_PER_UPDATE + 256,
        max_keys=64,
        max_depth=2,
    )


@bulk_message
class SampledSegment:
    """Rows of one segment. With `lengths`, item i is the `lengths[i]` consecutive
    rows starting at `rows[i]` (a sub-sequence of an episode)."""

    path: str
    rows: list[int]
    lengths: list[int] | None = None


@bulk_message
class SampledBatch:
    """One batch: `keys[i]` and `weights[i]` belong to the i-th item, counting the
    items of `segments` in order."""

    keys: list[int]
    segments: list[SampledSegment]
    weights: list[float]


@message
class SampleReply:
    batches: list[SampledBatch]
    #: Set when the items are held for the requesting task until acknowledged.
    hold_id: str | None = None


@message
class LimiterCounts:
    """Items a rate limiter counted: inserted and sampled (a shard's own, in its
    report; the job's other shards', relayed to it by the coordinator)."""

    inserted: Count
    sampled: Count

    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=KIB, max_containers=1, max_values=4, max_keys=4, max_depth=1
    )


@message
class ShardReport:
    """What a buffer process reports to the coordinator, which counts a job's env
    steps and episodes from it (and ends the job on them)."""

    #: Env steps of every segment accepted so far (it only grows).
    env_steps: int
    #: Items in the buffer now.
    size: int
    #: Returns of episodes that ended in segments accepted after `since` (at most the
    #: last 100), and the sequence number of the newest.
    episode_returns: list[float] = field(default_factory=list)
    returns_seq: int = 0
    #: What the process served since it started (they only grow while it runs; a
    #: restarted process counts from 0): the coordinator's metrics of the same names.
    segments_inserted: int = 0
    samples_served: int = 0
    sample_timeouts: int = 0
    inserts_rate_limited: int = 0
    inserts_busy: int = 0
    #: Its rate limiter's own counts (the coordinator relays the job's other shards'
    #: to each shard: `LimiterCounts`).
    limiter: LimiterCounts = field(default_factory=lambda: LimiterCounts(inserted=0, sampled=0))
    #: Sampled items by policy lag, as its stats count them: what the coordinator's
    #: TensorBoard charts, from the report rather than a stats call each point.
    sampled_lag_histogram: list[Count] = field(default_factory=list)


@message
class TaskEnds:
    """Tasks of a buffer process's job that ended: their credentials are refused from
    now on, and what a learn task held goes back to the buffer."""

    task_ids: Annotated[list[Ident], MaxLen(100_000)]

    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=8 * MIB, max_containers=4, max_values=100_008, max_keys=8, max_depth=2
    )


@message
class LearnerVersion:
    """The newest policy version the job's learner published: older items are stale."""

    version: Version

    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=KIB, max_containers=1, max_values=2, max_keys=2, max_depth=1
    )


@message
class PriorityUpdate:
    keys: Annotated[list[ItemKey], FailFast(), MaxLen(MAX_KEYS_PER_UPDATE)]
    priorities: Annotated[list[Priority], FailFast(), MaxLen(MAX_KEYS_PER_UPDATE)]
    #: The learn task the update comes from (a learner must name it).
    task_id: Ident | None = None

    #: MAX_KEYS_PER_UPDATE keys of 19 digits and priorities at full precision are
    #: about 2.9 MiB.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=4 * MIB,
        max_containers=8,
        max_values=2 * MAX_KEYS_PER_UPDATE + 8,
        max_keys=64,
        max_depth=2,
    )


@message
class PolicyRef:
    version: Version
    path: RelPath
    sha256: Annotated[str, MinLen(64), MaxLen(64)]
    train_iter: Count = 0
    #: The learn lease's epoch of the learner that wrote it.
    epoch: Count = 0


@message
class PolicyAnnounce:
    """A learner announces a version it wrote (`task_id`: its learn task, and `epoch`
    its lease's, so a learner whose task was reassigned cannot publish)."""

    version: Version
    path: RelPath
    sha256: Annotated[str, MinLen(64), MaxLen(64)]
    train_iter: Count = 0
    task_id: Ident | None = None
    epoch: Count = 0

    #: Every field at its bound in ASCII is about 1.3 KiB.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=16 * KIB, max_containers=8, max_values=64, max_keys=64, max_depth=1
    )

    def ref(self) -> PolicyRef:
        return PolicyRef(
            version=self.version,
            path=self.path,
            sha256=self.sha256,
            train_iter=self.train_iter,
            epoch=self.epoch,
        )


# --- jobs ------------------------------------------------------------------------


@message
class JobSubmit:
    config: dict[str, Any]
    name: Annotated[str, MaxLen(128)] | None = None

    #: A config holds at most 10,000 keys and items nested 12 levels below its top
    #: (common/config.py: MAX_CONFIG_ITEMS, MAX_CONFIG_DEPTH); the examples are 1 KiB.
    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=MIB, max_containers=20_000, max_values=20_000, max_keys=20_000, max_depth=14
    )


@message
class JobCreated:
    job_id: str
    phase: JobPhase
    warnings: list[str]


# --- experiments: many jobs from one config's sweep (jobconfig/sweep.py) --------------


@message
class ExperimentSubmit:
    """A config with a `sweep:` section; every job it expands to is checked first."""

    config: dict[str, Any]
    name: Annotated[str, MaxLen(128)] | None = None

    body_limit: ClassVar[BodyLimit] = JobSubmit.body_limit


@message
class ExperimentCreated:
    experiment_id: str
    #: Its jobs, in the sweep's order.
    job_ids: list[str]
    warnings: list[str]


@message
class ExperimentMember:
    """One job of an experiment: its point of the sweep and where it stands."""

    job_id: str
    #: The sweep's axis values of this job, by dotted config key.
    values: dict[str, Any]
    seed: int
    #: The job's phase; "forgotten" once the coordinator no longer keeps the job.
    phase: str
    env_steps: int = 0
    last_eval_return: float | None = None
    best_eval_return: float | None = None
    reason: str = ""
    #: A tuning's: the job's trial, how the trial ended (None: it runs; complete,
    #: pruned, failed) and its objective (a complete one's).
    trial: int | None = None
    trial_state: Literal["complete", "pruned", "failed"] | None = None
    objective: float | None = None


@message
class PopulationStep:
    """A step of population-based training (jobconfig/population.py): a member took a
    better member's checkpoint (exploit) and perturbed its hyperparameters (explore)."""

    #: When it was decided (wall time).
    at: float
    #: The member that took the checkpoint, and its env steps and last eval return then.
    job_id: str
    env_steps: int
    eval_return: float
    #: The member it was taken from, and its env steps and last eval return then.
    donor_id: str
    donor_env_steps: int
    donor_return: float
    #: The donor's checkpoint file copied (None: the donor had none yet; only explored).
    checkpoint: str | None
    #: The member's perturbed hyperparameters, by dotted config key: before and after.
    before: dict[str, Any]
    after: dict[str, Any]
    #: The member's newest policy version then: an evaluation of it, or of an older
    #: one, is of the line it left (not counted toward its next step).
    policy_version: int = 0


@message
class ExperimentStatus:
    experiment_id: str
    name: str
    #: running while any of its jobs is queued or running; then ended (or stopped).
    phase: Literal["running", "ended", "stopped"]
    created_at: float
    #: At most this many of its jobs run at once (`sweep.parallel`; None: no limit).
    parallel: int | None
    members: list[ExperimentMember]
    #: Its `pbt:` section (None: its jobs train each on its own), and its steps so far.
    population: dict[str, Any] | None = None
    lineage: list[PopulationStep] = field(default_factory=list)
    #: A tuning's `tune:` section (None: a sweep); its trials are its members.
    tuning: dict[str, Any] | None = None


@message
class CheckpointList:
    """A job's checkpoint files, oldest first (by learn lease, then train iteration)."""

    names: list[str]


@message
class ExperimentSummary:
    """An experiment as its listing shows it: its jobs counted, not each shown (`GET
    /experiments/<id>` shows them)."""

    experiment_id: str
    name: str
    phase: Literal["running", "ended", "stopped"]
    created_at: float
    parallel: int | None
    #: Its jobs, and how many of them have ended (or are forgotten).
    jobs: int
    jobs_ended: int
    #: It trains its jobs as one population (`pbt:`).
    population: bool = False


@message
class ExperimentList:
    experiments: list[ExperimentSummary]
    #: More experiments follow: pass it as `?page_token=` for the next page (None: no
    #: more).
    next_page_token: str | None = None


@message
class EvalSummary:
    return_mean: float
    return_std: float
    episodes: int
    policy_version: int
    train_iter: int
    env_steps: int
    #: The worst and best episode's return (None in records from before they were kept).
    return_min: float | None = None
    return_max: float | None = None
    #: The evaluation's video (an MP4 under the job's folder), or why there is none.
    video: str | None = None
    video_error: str = ""


@message
class LearnerSummary:
    """A learner training a job now: a learner group shows its ranks."""

    worker_id: str
    #: Ranks that train as this one learner (1: a learner on its own).
    world_size: int
    #: Each rank's device, in rank order ("cpu", "cuda:0", ...), as it registered.
    rank_devices: list[str]
    train_iters_per_s: float | None = None
    #: Items trained per second: in all, and by each rank.
    samples_per_s: float | None = None
    rank_samples_per_s: list[float] = field(default_factory=list)


@message
class WorkerShare:
    """A job's share of one role's workers (services/coordinator/shares.py)."""

    #: Workers it is owed now: its weighted fair share among the running jobs of its
    #: priority, after higher priorities (a fraction: 4 collectors, 3 jobs: 1.33).
    owed: float
    #: Workers it holds now.
    held: int
    #: Worker-seconds owed and held since it started running: what fairness is
    #: measured by over time.
    owed_s: float = 0.0
    held_s: float = 0.0


@message
class JobStatus:
    job_id: str
    name: str
    phase: JobPhase
    algo: str
    env_id: str
    env_steps: int
    train_iters: int
    policy_version: int
    last_eval: EvalSummary | None
    best_eval_return: float | None
    best_policy_version: int | None
    stop_value: float | None
    reason: str
    started_at: float
    finished_at: float | None
    #: The learners training it now (running jobs only).
    learners: list[LearnerSummary] = field(default_factory=list)
    #: Its budgets (`system.max_env_step`, `system.max_train_iter`; None: none).
    max_env_step: int | None = None
    max_train_iter: int | None = None
    #: Its tasks that failed, and those whose worker was lost (their work went back to
    #: the queue for another worker).
    task_failures: int = 0
    tasks_reassigned: int = 0
    #: Its `system.priority` and `system.share`.
    priority: int = 0
    share: float = 1.0
    #: Its share of the collectors and of the learners (running jobs; None otherwise).
    collector_share: WorkerShare | None = None
    learner_share: WorkerShare | None = None
    #: A queued job's place in the queue (1: next to run); None when not queued.
    queue_position: int | None = None
    #: Tasks of its ended at a safe point so that their worker went to another job.
    tasks_preempted: int = 0
    #: Seconds its writes have waited for room on the shared volume without progress
    #: (None: they have room); it fails at `system.storage_grace_s`.
    storage_full_s: float | None = None
    #: The experiment it is a job of (None: submitted alone).
    experiment_id: str | None = None
    #: Train iterations since those of its last evaluated policy (a training job with
    #: a policy; None otherwise): past a few `eval_freq`s, its reason says why.
    train_iters_since_eval: int | None = None


# --- small answers -------------------------------------------------------------------


@message
class JobList:
    jobs: list[JobStatus]
    #: More jobs follow: pass it as `?page_token=` for the next page (None: no more).
    next_page_token: str | None = None


@message
class WorkerList:
    workers: list[WorkerInfo]


@message
class MetricsPoint:
    """A running job's counters at one moment (one a second by default)."""

    #: Wall time, in seconds since the epoch.
    t: float
    env_steps: Count
    train_iters: Count
    buffer_size: Count
    policy_version: Version
    #: Mean return of the last (up to 100) collected episodes; None before one ends.
    collect_return_mean: float | None = None


@message
class RateLimiterState:
    samples_per_insert: float | None
    min_size_to_sample: Count
    error_buffer: float
    inserted: Count
    sampled: Count


@message
class BufferStats:
    """A job's replay buffer: exact counters; use, staleness and priorities over its
    live items (estimated from a fixed-size random draw above 65,536 items)."""

    size: Count
    capacity: Count
    sampler: str
    eviction: str
    item: str
    inserts: Count
    samples: Count
    sample_requests: Count
    #: Items evicted, by why: capacity, max_use, staleness.
    evictions: dict[str, Count]
    use_count_mean: float
    use_count_max: Count
    learner_version: Version
    staleness_mean: float
    staleness_max: int
    #: Sampled items by policy lag: entry i counts items i versions behind (the last
    #: entry, that many or more).
    sampled_lag_histogram: list[Count]
    priority_min: float | None
    priority_mean: float | None
    priority_max: float | None
    samples_per_insert_ratio: float | None
    limiter: RateLimiterState
    can_sample: bool
    can_insert: bool
    waiting_samplers: Count
    waiting_inserters: Count
    live_segments: Count
    released_segments: Count
    #: Items handed to a learner's task and not yet acknowledged (fifo buffers).
    held_items: Count = 0


@message
class JobMetrics:
    job_id: str
    points: list[MetricsPoint]
    evals: list[EvalSummary]
    buffer: BufferStats
    #: Segment files the learner skipped as unusable: their rows were not trained on.
    unusable_segments: list[str] = field(default_factory=list)


@message
class PrioritiesUpdated:
    #: How many keys were still in the buffer (the others were evicted and ignored).
    updated: int


@message
class TaskAck:
    task_id: str


@message
class WorkerAck:
    worker_id: str


@message
class Health:
    ok: bool
    reason: str = "ok"


@message
class SlaveTask:
    task_id: str
    job_id: str
    kind: str
    progress: dict[str, float]


@message
class SlaveStatus:
    role: str
    worker_id: str | None
    tasks: list[SlaveTask]


# --- the self-play league (services/coordinator/league.py) ----------------------------

#: Matches one draw request asks for at most.
MAX_MATCHES_PER_DRAW = 1024
#: Results one report carries at most.
MAX_RESULTS_PER_REPORT = 4096
#: An opponent's name in a league: a baseline's, `v<version>` or `self`.
MemberName = Annotated[str, MinLen(1), MaxLen(32)]
Sha256 = Annotated[str, MinLen(64), MaxLen(64)]


@message
class MatchDraw:
    """A battle collect task asks for the opponents of its next games."""

    task_id: Ident
    count: Annotated[int, Gt(0), Le(MAX_MATCHES_PER_DRAW)]

    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=4 * KIB, max_containers=2, max_values=8, max_keys=8, max_depth=1
    )


@message
class Match:
    """One game a collect task plays: against `opponent`, the learning policy on
    `learner_seat` (0: it moves first). A past version's policy file is named with the
    digest it was announced with; baselines and `self` have none."""

    match_id: Count
    opponent: MemberName
    learner_seat: Literal[0, 1]
    version: Version | None = None
    path: RelPath | None = None
    sha256: Sha256 | None = None


@message
class MatchList:
    matches: list[Match]


@message
class GameResult:
    """How a match ended, from the learning policy's side; `void`: the collector did
    not play it (its opponent could not be loaded), so the league lets go of it and
    counts it for nobody."""

    match_id: Count
    outcome: Literal["win", "draw", "loss", "void"]


@message
class GameResults:
    task_id: Ident
    results: Annotated[list[GameResult], FailFast(), MinLen(1), MaxLen(MAX_RESULTS_PER_REPORT)]

    body_limit: ClassVar[BodyLimit] = BodyLimit(
        max_bytes=512 * KIB,
        max_containers=MAX_RESULTS_PER_REPORT + 4,
        max_values=MAX_RESULTS_PER_REPORT * 3 + 8,
        max_keys=MAX_RESULTS_PER_REPORT * 2 + 8,
        max_depth=3,
    )


@message
class Rating:
    """An openskill rating: `ordinal` is mu - 3 sigma, what tables sort by."""

    mu: float
    sigma: float
    ordinal: float


@message
class LeagueMember:
    """An opponent in the pool, with the learning policy's games against it."""

    name: str
    kind: Literal["baseline", "snapshot"]
    version: int | None
    joined_env_steps: int
    mu: float
    sigma: float
    ordinal: float
    games: int
    wins: int
    draws: int
    losses: int
    #: (wins + draws / 2) / games (0.5 before any game).
    win_rate: float
    #: The share of the pool's draws it gets now.
    pfsp_weight: float


@message
class BattleSummary:
    """One battle evaluation: the version's games against each baseline."""

    policy_version: int
    train_iter: int
    env_steps: int
    win_rates: dict[str, float | None]
    tallies: dict[str, GameTally]
    #: The learning policy's rating (ordinal) when the result came in.
    rating: float | None = None


@message
class LeagueView:
    """A self-play job's league (GET /api/v1/jobs/<id>/league)."""

    #: The learning policy's rating.
    main: Rating
    members: list[LeagueMember]
    #: The learning policy's games against each opponent: pool members, `self`, and
    #: recently retired past versions.
    payoff: dict[str, GameTally]
    games: int
    #: Battle evaluations, newest last (the last 100).
    evaluations: list[BattleSummary]
