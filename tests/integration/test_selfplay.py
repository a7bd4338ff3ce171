"""Self-play through the services: a tic-tac-toe PPO job collects games against the
league's opponents, snapshots past versions into the pool, runs battle evaluations
and ends; its league endpoint shows the pool, ratings and payoff table, and what the
league holds survives a coordinator kill -9 and restart."""

import signal
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.config import deep_merge
from drover.cli import main as drover
from drover.local import LocalCluster
from drover.plot import plot
from jobconfig import load_config_file
from tests.helpers import wait_for_end, wait_until

pytestmark = [pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_config_file(ROOT / "examples" / "tictactoe_selfplay.yaml")


def league_of(cluster, job_id):
    return cluster.client.league(job_id)


def test_a_selfplay_job_collects_battles_evaluates_and_ends(tmp_path, monkeypatch, capsys):
    # A budget, not a threshold: the job ends by its env steps or its goal.
    config = deep_merge(
        CONFIG,
        {
            "system": {"max_env_step": 60_000},
            "policy": {"other": {"league": {"snapshot_every": 2}}},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 240)
        assert status.phase == "succeeded", status
        league = league_of(cluster, job_id)
        names = {m.name for m in league.members}
        assert {"random", "heuristic"} <= names
        snapshots = [m for m in league.members if m.kind == "snapshot"]
        assert snapshots and all(m.version is not None for m in snapshots)
        # games were played against the league's opponents and reported
        assert league.games > 0 and sum(t.wins + t.draws + t.losses for t in league.payoff.values())
        assert "self" in league.payoff
        # battle evaluations against both baselines, both seats
        assert league.evaluations
        last = league.evaluations[-1]
        assert set(last.tallies) == {"random", "heuristic"}
        games = last.tallies["random"]
        assert games.wins + games.draws + games.losses == config["env"]["n_evaluator_episode"]
        # TensorBoard has the league's scalars against env steps.
        events = EventAccumulator(str(cluster.shared_dir / job_id / "tb" / "coordinator"))
        events.Reload()
        tags = set(events.Tags()["scalars"])
        assert {"league/rating", "league/rating_random", "league/win_rate_heuristic"} <= tags
        # drover plot draws the win rate and the rating against env steps.
        for y_axis in ("win_rate", "rating"):
            out = plot([cluster.shared_dir / job_id], y_axis=y_axis, out=tmp_path / f"{y_axis}.png")
            assert out.stat().st_size > 1000
        # drover status shows the league: the policy's rating and each opponent's.
        monkeypatch.setenv("DROVER_COORDINATOR_URL", cluster.coordinator_url)
        monkeypatch.setenv("DROVER_TOKEN", cluster.token)
        monkeypatch.delenv("DROVER_TOKEN_FILE", raising=False)
        capsys.readouterr()
        assert drover(["status", job_id]) == 0
        shown = capsys.readouterr().out
        assert "league: rating" in shown and "heuristic" in shown and "pfsp weight" in shown
        assert drover(["status", job_id, "--json"]) == 0
        assert '"league"' in capsys.readouterr().out
        # Every battle segment passed the learner's checks: masks, and legal actions.
        assert cluster.client.metrics(job_id)["unusable_segments"] == []


def test_the_league_survives_a_coordinator_kill_and_restart(tmp_path):
    config = deep_merge(
        CONFIG,
        {
            "env": {"stop_value": None},
            "system": {"max_env_step": 10_000_000},
            "policy": {"other": {"league": {"snapshot_every": 2, "stop": None}}},
        },
    )
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        wait_until(
            lambda: (
                league_of(cluster, job_id).games > 200
                and any(m.kind == "snapshot" for m in league_of(cluster, job_id).members)
            ),
            120,
            "games and a snapshot",
        )
        # Let a snapshot of the coordinator's state be taken (every 2 s by default),
        # then stop the services that change the league, and read it.
        for service in cluster.collectors + cluster.learners:
            service.signal(signal.SIGSTOP)
        try:
            import time

            time.sleep(3.0)
            before = league_of(cluster, job_id)
            cluster.coordinator.signal(signal.SIGKILL)
            cluster.coordinator.wait(10)
            cluster.coordinator.start()
            cluster.wait_ready(60)
            after = wait_until(lambda: _league_or_none(cluster, job_id), 60, "the league back")
        finally:
            for service in cluster.collectors + cluster.learners:
                service.signal(signal.SIGCONT)
        assert [(m.name, m.version) for m in after.members] == [
            (m.name, m.version) for m in before.members
        ]
        assert after.payoff == before.payoff and after.games == before.games
        assert after.main == before.main
        assert [(m.mu, m.sigma) for m in after.members] == [(m.mu, m.sigma) for m in before.members]


def _league_or_none(cluster, job_id):
    try:
        return league_of(cluster, job_id)
    except Exception:
        return None


def test_bad_input_gets_a_4xx_naming_the_field_and_bad_segments_are_skipped(tmp_path):
    import requests

    config = deep_merge(
        CONFIG,
        {"system": {"max_env_step": 10_000_000}, "policy": {"other": {"league": {"stop": None}}}},
    )

    def send(cluster, method, path, **kwargs):
        headers = {"Authorization": f"Bearer {cluster.token}"}
        url = cluster.coordinator_url + path
        return requests.request(method, url, headers=headers, timeout=10, **kwargs)

    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        for env, field in [
            ({"env_id": "pettingzoo.classic.chess_v6"}, "config.env.env_id"),
            ({"env_id": "os"}, "config.env.env_id"),
            ({"env_id": "CartPole-v1"}, "config.env"),
        ]:
            bad = deep_merge(config, {"env": env})
            resp = send(cluster, "POST", "/api/v1/jobs", json={"config": bad})
            assert resp.status_code == 400, (env, resp.text)
            assert resp.json()["message"].startswith(field), resp.json()
        dqn = deep_merge(config, {"policy": {"type": "dqn"}})
        resp = send(cluster, "POST", "/api/v1/jobs", json={"config": dqn})
        assert resp.status_code == 400 and "system.workflow" in resp.json()["message"]
        assert send(cluster, "GET", "/api/v1/jobs/job-nope/league").status_code == 404

        job_id = cluster.client.submit_job(config).job_id
        wait_until(lambda: league_of(cluster, job_id).games > 0, 60, "games")
        collect = next(
            t for w in cluster.client.workers() for t in w.task_ids if t.startswith("collect")
        )
        for results, field, status in [
            ([{"match_id": 10**9, "outcome": "win"}], "results.0.match_id", 404),
            ([{"match_id": 0, "outcome": "maybe"}], "results.0.outcome", 400),
        ]:
            resp = send(
                cluster,
                "POST",
                f"/api/v1/jobs/{job_id}/league/results",
                json={"task_id": collect, "results": results},
            )
            assert resp.status_code == status, resp.text
            assert field in resp.json()["message"], resp.json()
        resp = send(
            cluster,
            "POST",
            f"/api/v1/jobs/{job_id}/league/matches",
            json={"task_id": collect, "count": 0},
        )
        assert resp.status_code == 400 and "count" in resp.json()["message"]
        assert cluster.client.job(job_id).phase == "running"
