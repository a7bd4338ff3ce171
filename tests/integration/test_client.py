"""`from drover import Client` against a real coordinator (a local cluster): the
README's "From Python" section runs as written; a typo is the error the CLI prints;
a job is stopped, listed, its evaluations followed and its artifacts fetched; the
client imports without torch, gymnasium or flask."""

import ast
import os
import re
import subprocess
import sys

import pytest

from common.config import deep_merge
from drover import ApiError, Client, ServiceUnavailable
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.helpers import EXAMPLE, ROOT

pytestmark = [pytest.mark.processes]

#: make run's DQN without a goal, ended by a small budget, evaluated and checkpointed
#: often.
SHORT = deep_merge(
    load_config_file(EXAMPLE),
    {
        "env": {"stop_value": None, "n_evaluator_episode": 2},
        "policy": {
            "eval": {"evaluator": {"eval_freq": 50}},
            "learn": {"checkpoint_every_iters": 50},
        },
        "system": {"max_env_step": 3000},
    },
)


def readme_python() -> str:
    """The code of the README's "From Python" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


@pytest.mark.timeout(400)
def test_the_readmes_from_python_section_runs_as_written(tmp_path):
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        env = {
            **os.environ,
            "DROVER_COORDINATOR_URL": cluster.coordinator_url,
            "DROVER_TOKEN": cluster.token,
        }
        (tmp_path / "examples").symlink_to(ROOT / "examples")  # as in a clone
        ran = subprocess.run(
            [sys.executable, "-c", readme_python()],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=360,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        lines = ran.stdout.splitlines()
        assert lines[0].startswith("succeeded eval return"), ran.stdout
        assert any(re.match(r"\s*[\d,]+ env steps: return \d", line) for line in lines)
        files = ast.literal_eval(lines[-2])  # the names the snippet printed
        assert "summary.json" in files and any(f.startswith("best-") for f in files)
        assert any(f.startswith("learner-e") for f in files)
        roles, jobs = lines[-1].rsplit(" ", 1)
        assert sorted(ast.literal_eval(roles)) == ["collector", "collector", "learner"]
        assert jobs == "1"


@pytest.mark.timeout(300)
def test_the_client_submits_follows_stops_and_fetches(tmp_path):
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        cluster.wait_for_workers()
        client = Client(cluster.coordinator_url, cluster.token, timeout_s=10.0)
        # A typo: refused with the line the CLI prints, nothing made.
        with pytest.raises(ApiError) as refused:
            client.submit({**SHORT, "policy": {"learn": {"learning_rat": 0.01}}})
        assert refused.value.status == 400
        assert "policy.learn.learning_rat: unknown key (did you mean 'learning_rate'?)" in (
            refused.value.message
        )
        assert client.jobs() == []
        job = client.submit(SHORT, name="short")
        seen = []
        status = client.wait(job.job_id, timeout_s=240, callback=seen.append, poll_s=0.5)
        assert status.phase == "succeeded" and seen and seen[0].job_id == job.job_id
        evals = list(client.evaluations(job.job_id, follow=True))
        assert evals and evals == sorted(evals, key=lambda e: e.env_steps)
        folder = client.download(job.job_id, tmp_path / "out")
        names = sorted(p.name for p in folder.iterdir())
        assert names[0].startswith("best-") and names[-1] == "summary.json"
        assert names[1].startswith("learner-e") and (folder / names[1]).stat().st_size > 1000
        # A second job, stopped.
        second = client.submit(SHORT)
        client.stop(second.job_id)
        client.wait(second.job_id, timeout_s=60, poll_s=0.5)
        assert client.job(second.job_id).phase == "stopped"
        assert [j.job_id for j in client.jobs()] == [second.job_id, job.job_id]
        assert {w.role for w in client.workers()} == {"collector", "learner"}
        with pytest.raises(ApiError) as missing:
            client.job("job-nope")
        assert missing.value.status == 404
    with pytest.raises(ServiceUnavailable):
        Client(cluster.coordinator_url, cluster.token, timeout_s=1.0).jobs()


def test_the_client_asks_for_a_token_it_was_not_given(monkeypatch):
    monkeypatch.delenv("DROVER_TOKEN", raising=False)
    monkeypatch.delenv("DROVER_TOKEN_FILE", raising=False)
    with pytest.raises(ValueError, match="DROVER_TOKEN"):
        Client("http://127.0.0.1:9")


def test_the_client_imports_and_reads_config_files_without_torch_gymnasium_or_flask():
    """What `pip install drover` holds (pyproject's dependencies) is enough."""
    blocked = "import sys\nfor m in ('torch', 'gymnasium', 'flask'): sys.modules[m] = None\n"
    read = (
        "from jobconfig.files import load_config\n"
        "load_config('examples/cartpole_dqn.yaml')\n"
        "load_config('examples/di_engine/cartpole_c51_config.py')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", blocked + read + "from drover import Client\nprint(Client)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0 and "drover.client.Client" in ran.stdout, ran.stderr
