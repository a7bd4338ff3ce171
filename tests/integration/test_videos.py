"""Evaluation videos through the services (`policy.eval.video_every`): a CartPole job
leaves an MP4 that plays (its frames decode) and an animation in TensorBoard, and its
evaluations say which video is theirs; a job on an env that cannot render says so in
its evaluations and trains on, nothing else changed."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.config import deep_merge
from common.storage import SharedStore
from common.video import decode
from drover.local import LocalCluster
from jobconfig import load_config_file
from tests.blind_env import ENV_ID
from tests.helpers import EXAMPLE, ROOT, wait_for_end

pytestmark = [pytest.mark.processes]

#: make run's DQN without a goal, 3,000 env steps, evaluated often, a video every 2.
SHORT = {
    "env": {"stop_value": None, "n_evaluator_episode": 2},
    "policy": {"eval": {"evaluator": {"eval_freq": 50}, "video_every": 2}},
    "system": {"max_env_step": 3000},
}


@pytest.mark.timeout(300)
def test_a_job_leaves_evaluation_videos_that_play_and_an_animation_in_tensorboard(tmp_path):
    config = deep_merge(load_config_file(EXAMPLE), SHORT)
    with LocalCluster(tmp_path / "run", num_collectors=1) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 240)
        assert status.phase == "succeeded", status
        evals = cluster.client.metrics(job_id)["evals"]
    store = SharedStore(cluster.run_dir)
    recorded = [e for e in evals if e["video"]]
    # Every second evaluation, the first included.
    assert [i for i, e in enumerate(evals) if e["video"]] == list(range(0, len(evals), 2))
    for e in recorded:
        assert e["video"] == f"{job_id}/videos/eval-{e['policy_version']:08d}.mp4"
        frames = decode(store.read_bytes(e["video"]), "mp4")
        assert frames.shape[1:] == (400, 600, 3) and len(frames) >= 2
    events = EventAccumulator(str(cluster.run_dir / job_id / "tb" / "coordinator"))
    events.Reload()
    assert "eval/video" in events.Tags()["images"]
    images = events.Images("eval/video")
    assert len(images) == len(recorded) and images[0].encoded_image_string[:6] == b"GIF89a"
    assert (images[0].width, images[0].height) == (320, 213)


@pytest.mark.timeout(300)
def test_an_env_that_cannot_render_says_so_and_the_job_goes_on(tmp_path):
    config = deep_merge(
        load_config_file(EXAMPLE),
        deep_merge(SHORT, {"env": {"env_id": ENV_ID}, "system": {"max_env_step": 1000}}),
    )
    modules = {"DROVER_ENV_MODULES": "tests.blind_env", "PYTHONPATH": str(ROOT)}
    with LocalCluster(tmp_path / "run", num_collectors=1, extra_env=modules) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        status = wait_for_end(cluster, job_id, 240)
        evals = cluster.client.metrics(job_id)["evals"]
    assert status.phase == "succeeded" and status.task_failures == 0, status
    assert evals and all(e["return_mean"] == 1.0 for e in evals)  # counted all the same
    assert not any(e["video"] for e in evals)
    assert evals[0]["video_error"] == (
        f"'{ENV_ID}' cannot render rgb_array (its render modes: none)"
    )
