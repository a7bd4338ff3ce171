"""Devices on this machine, where a collector acts, and `drover run`'s check: a job on
CUDA on a machine without CUDA stops before any process starts, or, with
--cpu-fallback, runs on CPU with a warning."""

import pytest
import torch
import yaml

from algorithms.base import Actor
from common.config import ConfigError
from common.devices import acting_device, cuda_devices, local_cuda, local_resources
from common.errors import ApiError
from drover import cli, devices
from drover.devices import fit_local_device
from jobconfig import fit_to_env, resolve_job_config
from services.collector import core as collector_core

NO_CUDA_HERE = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def resolved(raw):
    config, _ = resolve_job_config(raw)
    return config


def test_local_resources_count_what_torch_can_use(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert local_cuda() == (2, "")
    assert local_resources()["cuda_devices"] == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    count, why = local_cuda()
    assert count == 0 and torch.__version__ in why
    assert local_resources()["cuda_devices"] == 0


@pytest.mark.parametrize(
    ("resources", "count"),
    [({"cuda_devices": 2}, 2), ({"cuda_devices": 0}, 0), ({}, 0), ({"cuda_devices": True}, 0)],
)
def test_a_worker_that_reports_no_number_has_no_cuda(resources, count):
    assert cuda_devices(resources) == count


def no_cuda(monkeypatch):
    monkeypatch.setattr(devices, "local_cuda", lambda: (0, "torch here has no CUDA"))


@pytest.mark.parametrize(
    ("policy", "key", "fix"),
    [
        ({"cuda": True}, "policy.cuda", "policy.cuda: false"),
        ({"device": "cuda"}, "policy.device", "policy.device: cpu"),
    ],
)
def test_a_cuda_job_without_cuda_here_is_an_error_naming_the_key(monkeypatch, policy, key, fix):
    no_cuda(monkeypatch)
    raw = {"policy": policy}
    with pytest.raises(ConfigError) as err:
        fit_local_device(raw, resolved(raw), cpu_fallback=False)
    assert err.value.field == key
    assert "torch here has no CUDA" in err.value.message
    assert f"set {fix}" in err.value.message and "--cpu-fallback" in err.value.message


def test_cpu_fallback_runs_a_cuda_job_on_cpu_with_a_warning(monkeypatch):
    no_cuda(monkeypatch)
    raw = {"policy": {"cuda": True, "learn": {"batch_size": 32}}}
    local = fit_local_device(raw, resolved(raw), cpu_fallback=True)
    assert local.raw["policy"] == {"cuda": True, "learn": {"batch_size": 32}, "device": "cpu"}
    assert local.config.policy.torch_device == "cpu"
    assert local.config.policy.learn.batch_size == 32
    assert local.warnings == [
        "policy.cuda: true, but torch here has no CUDA: running on CPU (--cpu-fallback)"
    ]
    assert raw == {"policy": {"cuda": True, "learn": {"batch_size": 32}}}  # not changed


def test_a_machine_with_cuda_or_a_cpu_job_changes_nothing(monkeypatch):
    monkeypatch.setattr(devices, "local_cuda", lambda: (1, ""))
    raw = {"policy": {"cuda": True}}
    assert fit_local_device(raw, resolved(raw), cpu_fallback=False).raw is raw

    def torch_must_not_be_asked():
        raise AssertionError("a CPU job asked torch about CUDA")

    monkeypatch.setattr(devices, "local_cuda", torch_must_not_be_asked)
    local = fit_local_device({}, resolved({}), cpu_fallback=False)
    assert local.raw == {} and local.warnings == []


@pytest.mark.parametrize(
    ("policy", "cuda_here", "device"),
    [
        ({"cuda": True}, 1, "cuda"),  # auto: on CUDA where the collector has it
        ({"cuda": True}, 0, "cpu"),  # auto: a GPU learner's collectors act on CPU
        ({"cuda": False}, 1, "cpu"),  # auto: a CPU job acts on CPU everywhere
        ({"cuda": True, "collect": {"device": "cpu"}}, 1, "cpu"),
        ({"cuda": False, "collect": {"device": "cuda"}}, 1, "cuda"),
    ],
)
def test_where_a_collector_acts(policy, cuda_here, device):
    assert acting_device(resolved({"policy": policy}).policy, cuda_here) == device


@pytest.mark.parametrize(
    ("algo", "extra"),
    [("dqn", {}), ("ppo", {}), ("r2d2", {"model": {"lstm_hidden_size": 16}})],
)
def test_a_collector_without_cuda_acts_on_cpu_for_a_cuda_job(monkeypatch, algo, extra):
    monkeypatch.setattr(collector_core, "cuda_here", lambda: 0)
    config = resolved(
        {
            "env": {"env_id": "CartPole-v1"},
            "policy": {"type": algo, "cuda": True, **extra},
        }
    )
    config = fit_to_env(config)
    actor = collector_core.make_actor(config, Actor)
    assert {p.device.type for p in actor.network.parameters()} == {"cpu"}
    # the job itself still trains on CUDA
    assert config.policy.torch_device == "cuda"


def test_collectors_acting_only_on_cuda_need_cuda_here_too(monkeypatch):
    no_cuda(monkeypatch)
    raw = {"policy": {"collect": {"device": "cuda"}}}
    with pytest.raises(ConfigError) as err:
        fit_local_device(raw, resolved(raw), cpu_fallback=False)
    assert err.value.field == "policy.collect.device"
    assert "set policy.collect.device: auto" in err.value.message
    local = fit_local_device(raw, resolved(raw), cpu_fallback=True)
    assert local.config.policy.collect.device == "auto"
    assert local.config.policy.torch_device == "cpu"
    assert local.warnings == [
        "policy.collect.device: cuda, but torch here has no CUDA: running on CPU (--cpu-fallback)"
    ]


class UnstartableCluster:
    """Stands in for LocalCluster: starting a process fails the test."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("drover run started a local cluster")


class RefusingCluster:
    """Stands in for LocalCluster: records the config submitted, and refuses it, so
    the run ends there without any process."""

    submitted: list = []

    def __init__(self, run_dir, **kwargs):
        self.run_dir = run_dir
        self.client = self
        self.dashboard_url = "http://127.0.0.1:1/#token=t"

    def start(self):
        pass

    def submit_job(self, raw, name=None):
        RefusingCluster.submitted.append(raw)
        raise ApiError(400, "invalid", "recorded")

    def stop(self):
        pass


def cuda_config(tmp_path):
    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump({"exp_name": "gpu", "policy": {"cuda": True}}))
    return path


@NO_CUDA_HERE
def test_drover_run_on_cuda_without_cuda_stops_before_starting_anything(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(cli, "LocalCluster", UnstartableCluster)
    code = cli.main(["run", str(cuda_config(tmp_path)), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    line = next(line for line in err.splitlines() if "drover: error:" in line)
    assert "cuda.yaml: policy.cuda: true needs CUDA, but torch" in line
    assert "set policy.cuda: false, or pass --cpu-fallback" in line
    assert not (tmp_path / "runs").exists()


@NO_CUDA_HERE
def test_drover_run_with_cpu_fallback_warns_and_submits_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "LocalCluster", RefusingCluster)
    RefusingCluster.submitted.clear()
    code = cli.main(["run", str(cuda_config(tmp_path)), "--cpu-fallback"])
    err = capsys.readouterr().err
    assert "warning: policy.cuda: true, but torch" in err and "running on CPU" in err
    assert [raw["policy"] for raw in RefusingCluster.submitted] == [{"cuda": True, "device": "cpu"}]
    assert code == 2  # the stand-in coordinator refused it


# --- learner groups (--learner-ranks, policy.learn.multi_gpu) -----------------------


def test_learner_ranks_are_what_was_asked_for_when_the_batches_split():
    assert devices.local_learner_ranks(resolved({}), 2) == (2, [])
    assert devices.local_learner_ranks(resolved({}), None) == (1, [])


def test_a_batch_that_does_not_split_over_the_ranks_stops_drover_run():
    with pytest.raises(ConfigError) as refused:
        devices.local_learner_ranks(resolved({"policy": {"learn": {"batch_size": 65}}}), 2)
    assert refused.value.field == "policy.learn.batch_size"
    assert "65 does not split evenly over a learner group of 2 ranks" in refused.value.message
    ppo = resolved({"policy": {"type": "ppo", "collect": {"n_sample": 2049}}})
    with pytest.raises(ConfigError) as refused:
        devices.local_learner_ranks(ppo, 2)
    assert refused.value.field == "policy.collect.n_sample"


def test_multi_gpu_on_cpu_is_one_learner_with_a_note():
    ranks, notes = devices.local_learner_ranks(
        resolved({"policy": {"learn": {"multi_gpu": True}}}), None
    )
    assert ranks == 1 and "--learner-ranks N" in notes[0]


def test_multi_gpu_on_cuda_starts_a_rank_per_cuda_device(monkeypatch):
    monkeypatch.setattr(devices, "local_cuda", lambda: (4, ""))
    config = resolved({"policy": {"cuda": True, "learn": {"multi_gpu": True}}})
    assert devices.local_learner_ranks(config, None) == (4, [])


@NO_CUDA_HERE
def test_cuda_ranks_need_a_cuda_device_each():
    with pytest.raises(ConfigError) as refused:
        devices.local_learner_ranks(resolved({"policy": {"cuda": True}}), 2)
    assert refused.value.field == "--learner-ranks"
    assert "2 learner ranks on CUDA need 2 CUDA devices" in refused.value.message


def test_drover_run_refuses_learner_ranks_the_batch_does_not_split_over(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"policy": {"learn": {"batch_size": 64}}}))
    assert cli.main(["run", str(path), "--learner-ranks", "3", "--runs-dir", str(tmp_path)]) == 2
    assert "policy.learn.batch_size: 64 does not split evenly" in capsys.readouterr().err
    assert not list(tmp_path.glob("*/logs"))  # nothing started
