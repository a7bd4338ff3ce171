"""How workers are divided among jobs (services/coordinator/shares.py): weighted fair
shares within a priority, higher priorities first, whole gangs, and balances that move
the odd worker from job to job so that shares hold over time."""

import pytest

from services.coordinator.shares import (
    Claim,
    divide,
    owed_shares,
    settle_credit,
    starting_credit,
)

SLACK_S = 4.0


def claim(job_id, want, **kw):
    return Claim(job_id=job_id, want=want, order=(kw.pop("order", 0), job_id), **kw)


def test_owed_shares_are_weighted_max_min_fair():
    # 4 workers, weights 1:1:2
    owed = owed_shares([claim("a", 4), claim("b", 4), claim("c", 4, weight=2)], 4)
    assert owed == pytest.approx({"a": 1, "b": 1, "c": 2})
    # A job that can use 1 leaves the rest to the others (water-filling).
    owed = owed_shares([claim("a", 1), claim("b", 8), claim("c", 8)], 7)
    assert owed == pytest.approx({"a": 1, "b": 3, "c": 3})
    # A job that wants nothing is owed nothing.
    assert owed_shares([claim("a", 0), claim("b", 3)], 3) == pytest.approx({"a": 0, "b": 3})


def test_a_higher_priority_is_served_first_and_the_rest_share_what_it_leaves():
    claims = [claim("a", 4), claim("b", 4), claim("p", 3, priority=10)]
    assert owed_shares(claims, 4) == pytest.approx({"a": 0.5, "b": 0.5, "p": 3})
    division = divide(claims, 4, SLACK_S)
    assert division.target["p"] == 3 and division.target["a"] + division.target["b"] == 1
    # ... and it takes every worker it can use.
    claims = [claim("a", 4, held=2), claim("b", 4, held=2), claim("p", 4, priority=10)]
    assert divide(claims, 4, SLACK_S).target == {"a": 0, "b": 0, "p": 4}


def test_a_claim_on_standby_gets_only_what_no_other_wants():
    """A job waiting for a learner keeps collectors nobody else can use, and gives them
    up first, whatever its priority."""
    claims = [claim("a", 2), claim("b", 2), claim("w", 4, standby=True, priority=5, held=2)]
    assert divide(claims, 6, SLACK_S).target == {"a": 2, "b": 2, "w": 2}
    assert owed_shares(claims, 6)["w"] == pytest.approx(2)
    claims = [claim("a", 4), claim("b", 2), claim("w", 4, standby=True, priority=5, held=2)]
    assert divide(claims, 6, SLACK_S).target == {"a": 4, "b": 2, "w": 0}


def test_every_worker_is_given_while_a_job_can_use_it():
    division = divide([claim("a", 4), claim("b", 4), claim("c", 4)], 4, SLACK_S)
    assert sorted(division.target.values()) == [1, 1, 2]
    # A gang that does not fit leaves its workers to the others.
    division = divide([claim("g", 3, gang=True), claim("a", 4)], 2, SLACK_S)
    assert division.target == {"g": 0, "a": 2}


def test_a_gang_gets_its_whole_set_or_none():
    for credit in (-20.0, 0.0, 20.0):
        claims = [claim("g", 2, gang=True, credit_s=credit), claim("a", 3), claim("b", 3)]
        assert divide(claims, 3, SLACK_S).target["g"] in (0, 2)


def test_the_holder_keeps_the_odd_worker_until_another_job_is_slack_behind():
    """Hysteresis: a worker moves when another job is `slack_s` further behind."""
    held = [claim("a", 4, held=2, credit_s=0.0), claim("b", 4, held=1), claim("c", 4, held=1)]
    assert divide(held, 4, SLACK_S).target["a"] == 2
    behind = [
        claim("a", 4, held=2, credit_s=-2.0),
        claim("b", 4, held=1, credit_s=SLACK_S),
        claim("c", 4, held=1),
    ]
    assert divide(behind, 4, SLACK_S).target == {"a": 1, "b": 2, "c": 1}


def simulate(claims, capacity, seconds, *, step_s=0.5, warmup_s=0.0):
    """Passes every `step_s`, tasks ending at once when released: the worker-seconds
    each job held after `warmup_s`, the workers moved, and each job's longest run of
    passes with nothing."""
    held = {c.job_id: 0 for c in claims}
    credit = {c.job_id: 0.0 for c in claims}
    seconds_held = {c.job_id: 0.0 for c in claims}
    longest_without = dict.fromkeys(held, 0.0)
    without = dict.fromkeys(held, 0.0)
    moved, t = 0, 0.0
    while t < seconds:
        now = [
            Claim(
                job_id=c.job_id,
                priority=c.priority,
                weight=c.weight,
                want=c.want,
                gang=c.gang,
                held=held[c.job_id],
                credit_s=credit[c.job_id],
                order=c.order,
            )
            for c in claims
        ]
        division = divide(now, capacity, SLACK_S)
        for job in held:
            credit[job] = settle_credit(credit[job], division.owed[job], held[job], step_s, SLACK_S)
            moved += max(0, held[job] - division.target[job])
            held[job] = division.target[job]
        if t >= warmup_s:
            for job, count in held.items():
                seconds_held[job] += count * step_s
                without[job] = 0.0 if count else without[job] + step_s
                longest_without[job] = max(longest_without[job], without[job])
        t += step_s
    return seconds_held, moved, longest_without


def test_three_equal_jobs_on_four_workers_each_hold_a_third_over_time():
    claims = [claim(j, 4, order=i) for i, j in enumerate("abc")]
    held, moved, without = simulate(claims, 4, 50.0, warmup_s=10.0)
    total = sum(held.values())
    for job in "abc":
        assert held[job] / total == pytest.approx(1 / 3, rel=0.1)
    assert max(without.values()) == 0  # none is ever left with none
    assert 0 < moved <= 15  # the odd worker moves every few seconds, not every pass


def test_weights_one_one_two_hold_a_quarter_a_quarter_and_a_half():
    claims = [claim("a", 4), claim("b", 4, order=1), claim("c", 4, weight=2, order=2)]
    held, _, _ = simulate(claims, 4, 50.0, warmup_s=10.0)
    total = sum(held.values())
    assert [held[j] / total for j in "abc"] == pytest.approx([0.25, 0.25, 0.5], rel=0.1)


def test_a_gang_owed_less_than_its_set_runs_in_turns_and_nobody_starves():
    """A sync job needing 2 collectors beside two jobs on 3: each is owed 1; the gang
    holds 2 about half of the time, and every job gets its third."""
    claims = [claim("g", 2, gang=True), claim("a", 3, order=1), claim("b", 3, order=2)]
    held, _, without = simulate(claims, 3, 300.0, warmup_s=20.0)
    total = sum(held.values())
    for job in "gab":
        assert held[job] / total == pytest.approx(1 / 3, rel=0.15)
    assert max(without.values()) < 30.0  # each waits its turn for seconds, not for ever


def test_more_jobs_than_workers_take_turns():
    claims = [claim(str(i), 4, order=i) for i in range(6)]
    held, _, without = simulate(claims, 4, 120.0, warmup_s=10.0)
    total = sum(held.values())
    for share in held.values():
        assert share / total == pytest.approx(1 / 6, rel=0.15)
    assert max(without.values()) < 20.0


def test_a_balance_is_bounded():
    credit = 0.0
    for _ in range(10_000):
        credit = settle_credit(credit, owed=1.0, held=0, dt_s=1.0, slack_s=SLACK_S)
    assert credit == pytest.approx(4 * SLACK_S)
    for _ in range(10_000):
        credit = settle_credit(credit, owed=0.0, held=2, dt_s=1.0, slack_s=SLACK_S)
    assert credit == pytest.approx(-4 * SLACK_S * 2)


def test_a_job_starts_level_with_the_others():
    assert starting_credit([], served_first=True) == 0.0
    assert starting_credit([-3.0, 1.5, 0.0], served_first=True) == 1.5
    assert starting_credit([-3.0, 1.5, 0.0], served_first=False) == -3.0
