"""How the coordinator divides its workers of one role among the running jobs.

Within a priority, jobs share by weight (`system.share`): each is owed its weighted
max-min fair share of the workers, never more than it can use (`Claim.want`). A higher
priority is served first, whole; what it leaves goes to the next. A job that needs a
fixed set at once (a `sync` round over N collectors: `Claim.gang`) is given all N or
none.

Workers are whole, shares are not: 4 collectors among 3 jobs are owed 1⅓ each. Each
job keeps a running balance (`Claim.credit_s`: worker-seconds it was owed minus those
it held), and each pass the workers go, one request at a time, to the job that would
be furthest behind: the job's balance plus what it is owed beyond the units it already
has, over a horizon. The extra collector thus moves from job to job, and a gang
that is owed 1 collector but needs 2 runs about half the time. A job keeps what it
holds until another is `slack_s` worker-seconds further behind than it (hysteresis),
so workers move every few seconds, not every pass: moving one ends a task.

Pure logic, no locks, no I/O: `planning.py` calls `divide` each pass, per role, and
`settle_credit` to move the balances on.

    claims = [Claim("job-a", priority=0, weight=1, want=4, gang=False, held=3, ...), ...]
    division = divide(claims, capacity=4, slack_s=4.0)
    division.owed["job-a"], division.target["job-a"]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The horizon, in multiples of `slack_s`, over which a job's owed share counts against
#: its balance when workers are handed out: a job's units within its owed share go
#: before another's beyond it unless their balances differ by more than this.
HORIZON_SLACKS = 2.0
#: A balance is kept within this many multiples of `slack_s` (per worker the job can
#: use): a job that waited long is paid back over a bounded time, not for ever.
CREDIT_BOUND_SLACKS = 4.0


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One running job's ask for workers of one role in a scheduling pass."""

    job_id: str
    priority: int = 0
    #: Its `system.share` (> 0).
    weight: float = 1.0
    #: The most workers of the role it can use now (0: none; it is owed nothing).
    want: int
    #: All `want` at once or none (a sync round over `want` collectors).
    gang: bool = False
    #: Workers it holds now (tasks that are not being released).
    held: int = 0
    #: Worker-seconds owed minus worker-seconds held so far (its balance).
    credit_s: float = 0.0
    #: Ties go to the smaller (the older job).
    order: tuple[Any, ...] = ()
    #: It can use workers, but only those no other claim wants (a job waiting for a
    #: learner may fill its buffer with collectors nobody else needs): served after
    #: every other claim, whatever its priority.
    standby: bool = False

    @property
    def rank(self) -> tuple[bool, int]:
        """What goes first: claims not on standby, then higher priorities."""
        return (self.standby, -self.priority)


@dataclass(frozen=True)
class Division:
    #: Each job's fair share now (a fraction of workers).
    owed: dict[str, float] = field(default_factory=dict)
    #: How many workers each job should hold after this pass.
    target: dict[str, int] = field(default_factory=dict)


def by_priority(claims: Iterable[Claim]) -> list[list[Claim]]:
    """The claims in tiers of equal priority, highest first (those on standby last)."""
    ordered = sorted(claims, key=lambda c: c.rank)
    return [list(tier) for _, tier in itertools.groupby(ordered, key=lambda c: c.rank)]


def owed_shares(claims: Sequence[Claim], capacity: int) -> dict[str, float]:
    """Each claim's weighted max-min fair share of `capacity` workers, tier by tier:
    within a tier, each gets workers in proportion to its weight, none more than its
    `want`, what one cannot use going to the others (water-filling)."""
    owed = {c.job_id: 0.0 for c in claims}
    left = float(capacity)
    for tier in by_priority(claims):
        open_ = [c for c in tier if c.want > 0]
        pool = left
        while open_ and pool > 1e-9:
            weights = sum(c.weight for c in open_)
            full = [c for c in open_ if c.want - owed[c.job_id] <= pool * c.weight / weights]
            if not full:
                for c in open_:
                    owed[c.job_id] += pool * c.weight / weights
                pool = 0.0
                break
            for c in full:
                pool -= c.want - owed[c.job_id]
                owed[c.job_id] = float(c.want)
                open_.remove(c)
        left = pool
    return owed


def divide(claims: Sequence[Claim], capacity: int, slack_s: float) -> Division:
    """The owed shares and this pass's whole-worker targets (see the module's text).

    Every request is a job's next unit (a gang's whole set at once), scored by how far
    behind the job would be: its balance, plus its owed share beyond the units before
    this one over `HORIZON_SLACKS * slack_s` seconds, plus `slack_s` for a unit it
    holds already. Higher priorities go first, then higher scores, then older jobs; a
    request that does not fit in what is left is passed over (the rest still fill the
    workers: nothing idles while a job can use it).
    """
    owed = owed_shares(claims, capacity)
    horizon_s = HORIZON_SLACKS * slack_s
    requests: list[tuple[tuple[bool, int], float, tuple[Any, ...], str, int]] = []
    for c in claims:
        if c.want <= 0:
            continue
        share = owed[c.job_id]
        if c.gang:
            # The set's mean unit: a gang owed less than its size waits its turn.
            score = c.credit_s + horizon_s * (share - (c.want - 1) / 2)
            score += slack_s * c.want if c.held >= c.want else 0.0
            requests.append((c.rank, score, c.order, c.job_id, c.want))
            continue
        for unit in range(1, min(c.want, capacity) + 1):
            score = c.credit_s + horizon_s * (share - unit + 1)
            score += slack_s if unit <= c.held else 0.0
            requests.append((c.rank, score, c.order, c.job_id, 1))
    requests.sort(key=lambda r: (r[0], -r[1], r[2]))
    target = {c.job_id: 0 for c in claims}
    left = capacity
    for _, _, _, job_id, units in requests:
        if units <= left:
            target[job_id] += units
            left -= units
    return Division(owed=owed, target=target)


def settle_credit(credit_s: float, owed: float, held: int, dt_s: float, slack_s: float) -> float:
    """A job's balance `dt_s` seconds on, owed `owed` workers and holding `held`:
    kept within `CREDIT_BOUND_SLACKS * slack_s` per worker it is owed (at least one)."""
    bound = CREDIT_BOUND_SLACKS * slack_s * max(1.0, owed, float(held))
    return min(bound, max(-bound, credit_s + dt_s * (owed - held)))


def starting_credit(others: Iterable[float], *, served_first: bool) -> float:
    """The balance a job starts running with, level with the running jobs' balances
    (`others`) so that their history is neither its debt nor its due: level with the
    one furthest behind when it should be `served_first` (collectors: a new job gets
    some at the next pass), else with the one furthest ahead (learners: it waits about
    a slack for its turn, as they take theirs, rather than end a learn task at once)."""
    others = list(others)
    if not others:
        return 0.0
    return max(others) if served_first else min(others)
