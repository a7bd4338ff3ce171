"""`drover export` round trips: for every algorithm with every action space it has,
the exported network (ONNX through onnxruntime, TorchScript through torch.jit) takes
the actions drover's own actor takes in evaluation, on 1,000 observations: exactly
for discrete actions, within 1e-5 for continuous ones; R2D2's recurrent state goes in
and out. And what cannot be exported is one clear line."""

import json

import numpy as np
import pytest
import torch

from algorithms.registry import ALGORITHMS
from common.config import obs_shape_of, to_dict
from common.models import state_to_numpy
from common.storage import SharedStore
from drover.cli import main
from tests.algorithm_runs import CASES, JOB, job_config

OBSERVATIONS = 1000
#: R2D2 acts on this many envs at once, OBSERVATIONS / ENVS steps in a row.
ENVS = 8


def onnx_runtime():
    """onnxruntime, to run an ONNX export; the ONNX cases alone are skipped without it
    (and onnxscript, which torch's exporter needs): the TorchScript ones still run."""
    pytest.importorskip("onnxscript", reason="onnxscript is not installed")
    return pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def trained_job(tmp_path, algo, space, **overrides):
    """A job folder with its config and one policy of weights far from their init (so
    that no two actions' values are near a tie), as a learner publishes it; running
    normalization statistics (PPO's `policy.normalize`) far from theirs too."""
    config = job_config(algo, space, **overrides)
    store = SharedStore(tmp_path)
    store.write_json(f"{JOB}/job.json", to_dict(config))
    learner = ALGORITHMS[algo].make_learner(config.policy, "cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in learner.online.parameters():
            # Of a trained network's scale: activations of about 1 in every layer.
            fan_in = parameter.shape[-1] if parameter.dim() > 1 else 100
            parameter.normal_(0.0, 1.0 / fan_in**0.5)
        for name, buffer in learner.online.named_buffers():
            if name.endswith("norm.mean"):
                buffer.normal_(0.0, 2.0)
            elif name.endswith("norm.var"):
                buffer.uniform_(0.25, 4.0)
    path, _ = store.write_policy(JOB, 1, 100, algo, state_to_numpy(learner.online))
    store.write_json(f"{JOB}/policies/latest.json", {"version": 1, "path": path})
    actor = ALGORITHMS[algo].make_actor(config.policy)
    actor.load(1, store.read_policy(path).tensors)
    return tmp_path / JOB, config, actor


@pytest.mark.parametrize(("algo", "space"), CASES, ids=[f"{a}-{s}" for a, s in CASES])
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_the_exported_network_acts_as_drovers_actor(tmp_path, algo, space, fmt):
    acts_as_drovers_actor(tmp_path, algo, space, fmt)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_an_exported_ppo_normalizes_its_observations_as_drovers_actor(tmp_path, fmt):
    normalized = {"policy": {"normalize": {"obs": True, "reward": True}}}
    acts_as_drovers_actor(tmp_path, "ppo", "continuous", fmt, **normalized)


def acts_as_drovers_actor(tmp_path, algo, space, fmt, **overrides):
    ort = onnx_runtime() if fmt == "onnx" else None
    job_dir, config, actor = trained_job(tmp_path, algo, space, **overrides)
    out = tmp_path / "out"
    assert main(["export", str(job_dir), "--format", fmt, "--out", str(out)]) == 0
    model = out / ("policy.onnx" if fmt == "onnx" else "policy.pt")
    readme = (out / "README.md").read_text()
    assert f"{algo} on {config.env.env_id}" in readme and "| `obs` |" in readme
    if ort is not None:
        session = ort.InferenceSession(str(model))
        run = lambda *inputs: session.run(  # noqa: E731
            None, {i.name: x for i, x in zip(session.get_inputs(), inputs, strict=True)}
        )
    else:
        module = torch.jit.load(str(model))
        run = lambda *inputs: [o.detach().numpy() for o in module(*map(torch.as_tensor, inputs))]  # noqa: E731
    rng = np.random.default_rng(1)
    shape = (OBSERVATIONS, *obs_shape_of(config.policy.model))
    obs = rng.normal(0.0, 1.0, size=shape).astype(np.float32)
    if ALGORITHMS[algo].recurrent:
        hidden = actor.network.hidden_size
        h = c = np.zeros((ENVS, hidden), np.float32)
        for step in obs.reshape(OBSERVATIONS // ENVS, ENVS, *obs.shape[1:]):
            expected = actor.greedy(step, rng)
            action, _, h, c = run(step, h, c)
            assert np.array_equal(action, expected)
        return
    expected = actor.greedy(obs, rng)
    action = run(obs)[0]
    if space == "discrete":
        assert action.dtype == np.int64 and np.array_equal(action, expected)
    else:
        assert action.shape == expected.shape
        np.testing.assert_allclose(action, expected, rtol=0, atol=1e-5)


def test_what_cannot_be_exported_is_one_clear_line(tmp_path, capsys):
    def said(*args):
        assert main(["export", *map(str, args)]) == 2
        return capsys.readouterr().err

    assert "no such file or folder" in said(tmp_path / "nope")
    assert "no job in it" in said(tmp_path)
    job_dir, _, _ = trained_job(tmp_path / "run", "dqn", "discrete")
    (job_dir / "policies" / "latest.json").unlink()
    assert "has no policy to export" in said(job_dir)
    # A policy file another algorithm wrote, in this DQN job's folder.
    store = SharedStore(tmp_path / "run")
    path, _ = store.write_policy(JOB, 2, 0, "sac", {"w": np.ones(2, np.float32)})
    assert "written by algorithm 'sac'" in said(tmp_path / "run" / path)
    store.write_policy(JOB, 3, 0, "nope", {"w": np.ones(2, np.float32)})
    assert "no algorithm drover has" in said(job_dir / "policies" / "00000003.safetensors")
    other = tmp_path / "run" / "job-2"
    other.mkdir()
    (other / "job.json").write_text(json.dumps({}))
    assert "2 jobs in it" in said(tmp_path / "run")
    with pytest.raises(SystemExit) as usage:  # argparse's own line, and status 2
        main(["export", str(job_dir), "--format", "gif"])
    assert usage.value.code == 2 and "invalid choice: 'gif'" in capsys.readouterr().err
