"""The coordinator's web dashboard: its files are served without a token and never from
outside their folder; in a real browser it signs in, lists jobs, draws a job's curves
and lists workers, says so when an answer does not come and redraws when answers come
again, and shows nothing but an error for a wrong token."""

import os
import shutil
from pathlib import Path

import pytest

from common.config import deep_merge
from common.storage import SharedStore
from jobconfig import load_config_file
from services.coordinator.app import create_app
from services.coordinator.settings import CoordinatorSettings
from tests.buffer_hosts import make_coordinator
from tests.coordinator_app import AUTH, TOKEN

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cartpole_dqn.yaml"
WAIT_MS = 120_000


@pytest.fixture
def client(tmp_path):
    core = make_coordinator(SharedStore(tmp_path))
    return create_app(
        CoordinatorSettings(shared_dir=tmp_path, token=TOKEN), core=core
    ).test_client()


def test_the_page_and_its_files_need_no_token(client):
    page = client.get("/")
    assert page.status_code == 200
    assert page.mimetype == "text/html"
    assert b'<script src="/dashboard/app.js">' in page.data
    script = client.get("/dashboard/app.js")
    assert script.status_code == 200
    assert "javascript" in script.mimetype
    assert b"sessionStorage" in script.data and b"Authorization" in script.data
    assert client.get("/dashboard/style.css").mimetype == "text/css"
    assert client.get("/dashboard/index.html").status_code == 200


def test_the_api_still_needs_a_token(client):
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/api/v1/jobs", headers=AUTH).status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/dashboard/../app.py",
        "/dashboard/..%2fapp.py",
        "/dashboard/%2e%2e/%2e%2e/app.py",
        "/dashboard/..%2F..%2Fapi%2F__init__.py",
        "/dashboard/%2Fetc%2Fpasswd",
        "/dashboard//etc/passwd",
        "/dashboard/no-such-file.js",
        "/dashboard/",
    ],
)
def test_nothing_outside_the_dashboard_folder_is_served(client, path):
    for headers in ({}, AUTH):
        resp = client.get(path, headers=headers)
        assert resp.status_code in (401, 404), (path, resp.status_code)
        assert resp.is_json, path  # a JSON error, never a file
        if headers:
            assert resp.status_code == 404, path


# --- in a real browser ----------------------------------------------------------------


def save_screenshot(page, tmp_path):
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot))
    if os.environ.get("DROVER_TEST_ARTIFACTS"):
        artifacts = Path(os.environ["DROVER_TEST_ARTIFACTS"])
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, artifacts / shot.name)
    if os.environ.get("DROVER_SAVE_SCREENSHOT") == "1":
        shutil.copy(shot, ROOT / "docs" / "dashboard.png")
    return shot


def wait_in_page(page, expression, cluster, job_id):
    """Wait for `expression` to hold in the page; when it does not in time, fail with
    what the page, the job and the services' logs showed (a run that stalls says why)."""
    try:
        page.wait_for_function(expression, timeout=WAIT_MS)
    except Exception as exc:  # playwright's TimeoutError
        job = cluster.client.job(job_id)
        evals = len(cluster.client.metrics(job_id)["evals"])
        logs = "\n".join(f"--- {s.name} ---\n{s.log_tail(30)}" for s in cluster.services)
        pytest.fail(
            f"{expression} did not hold within {WAIT_MS / 1000:g} s ({exc!r}); the page's "
            f"error: {page.inner_text('#error')!r}; the job: {job.phase}, "
            f"{job.train_iters} train iters, {job.env_steps} env steps, {evals} evals "
            f"({job.reason!r}); the logs end:\n{logs}"
        )


def sign_in(page, url, token):
    page.goto(url)
    page.fill("#token", token)
    page.click("#login button[type=submit]")


@pytest.mark.browser
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_the_dashboard_in_a_browser(tmp_path):
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    from drover.local import LocalCluster

    # No goal: it runs (and holds its share) until the test stops it.
    # A video of every evaluation: the job's page plays the newest.
    config = deep_merge(
        load_config_file(EXAMPLE),
        {"env": {"stop_value": None}, "policy": {"eval": {"video_every": 1}}},
    )
    with (
        LocalCluster(tmp_path / "run", num_collectors=1) as cluster,
        sync_api.sync_playwright() as pw,
    ):
        job_id = cluster.client.submit_job(config, name="dashboard-test").job_id
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            # What `drover run` prints opens signed in, and the token leaves the
            # address bar at once.
            page.goto(cluster.dashboard_url)
            row = page.locator(f'tr.job[data-job-id="{job_id}"]')
            row.wait_for(timeout=30_000)
            assert "dashboard-test" in row.inner_text() and "CartPole-v1" in row.inner_text()
            assert "token" not in page.url and page.url.endswith("#/jobs")
            # Its share while it runs: the one collector, all it is owed.
            wait_in_page(
                page,
                f"document.querySelector('tr.job[data-job-id=\"{job_id}\"] td.share')"
                "?.innerText === '1 / 1.00'",
                cluster,
                job_id,
            )

            # A job's page: its return curve gets points as evaluations come in.
            row.click()
            page.wait_for_selector("#return-chart", timeout=30_000)
            wait_in_page(
                page,
                "document.querySelector('#return-chart')?.dataset.points >= 2",
                cluster,
                job_id,
            )
            wait_in_page(
                page,
                "document.querySelector('#throughput-chart')?.dataset.points >= 1",
                cluster,
                job_id,
            )
            assert page.locator("#return-chart path.line").count() == 1
            # The evaluation's video loads in its element (its frames decoded).
            wait_in_page(
                page,
                "document.querySelector('#eval-video')?.readyState >= 2",
                cluster,
                job_id,
            )
            assert page.evaluate("document.querySelector('#eval-video').videoWidth") == 600
            assert page.locator("#lag-chart").count() == 1
            assert "Replay buffer" in page.inner_text("main")
            # Its env step budget, and how much of it is spent.
            budget = page.locator('.budget[data-budget="env steps"]')
            assert "/ 200.0k" in budget.inner_text()
            assert 0 < float(budget.locator("progress").get_attribute("value")) < 1
            assert "collectors held / owed" in page.inner_text("main")
            save_screenshot(page, tmp_path)

            # An experiment (a population): its points over their seeds, its jobs, and
            # its population's steps (none yet).
            sweep = {"seeds": 1, "axes": {"policy.nstep": [1, 3]}}
            pbt = {"params": ["policy.learn.learning_rate"]}
            experiment = cluster.client.submit_experiment(
                {**config, "sweep": sweep, "pbt": pbt}, name="exp"
            )
            page.click("#nav-experiments")
            page.wait_for_selector("tr.experiment", timeout=30_000)
            assert experiment.experiment_id in page.inner_text("#experiments")
            page.locator("tr.experiment").first.click()
            page.wait_for_selector("#points tr.point", timeout=30_000)
            assert page.locator("#points tr.point").count() == 2
            assert page.locator("#members tr.member").count() == 2
            assert "nstep=1" in page.inner_text("#points")
            assert "Population steps (0)" in page.inner_text("main")
            cluster.client.stop_experiment(experiment.experiment_id)

            # Workers: the collector and the learner, with their heartbeats.
            page.click("#nav-workers")
            page.wait_for_selector('tr.worker[data-role="collector"]', timeout=30_000)
            page.wait_for_selector('tr.worker[data-role="learner"]', timeout=30_000)
            assert page.locator("tr.worker").count() == 2
            assert page.locator("#error").is_hidden()

            # An answer that never comes: the page says so instead of waiting for good,
            # and redraws once answers come again.
            held = []

            def hold(route):
                held.append(route)  # never answered

            page.route("**/api/v1/workers", hold)
            page.wait_for_selector("#error:not([hidden])", timeout=30_000)
            assert "/workers: no answer in 10 s" in page.inner_text("#error")
            assert held
            page.unroute("**/api/v1/workers")
            page.wait_for_selector("#error", state="hidden", timeout=30_000)

            # A wrong token: an error, and no data.
            other = browser.new_context()
            stranger = other.new_page()
            sign_in(stranger, cluster.coordinator_url + "/", "not-the-token")
            stranger.wait_for_selector("#error:not([hidden])", timeout=30_000)
            assert "refused (401)" in stranger.inner_text("#error")
            assert stranger.locator("tr.job").count() == 0
            assert stranger.evaluate("sessionStorage.getItem('drover.token')") is None
            other.close()
        finally:
            browser.close()
        cluster.client.stop_job(job_id)
