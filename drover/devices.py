"""`drover run`'s device checks: the local cluster runs on this machine, so a job on
CUDA (`policy.cuda: true` or `policy.device: cuda`, or collectors that act only on
CUDA: `policy.collect.device: cuda`) needs CUDA here. Without it the
run stops before any process starts, instead of every task failing with "Torch not
compiled with CUDA enabled"; `--cpu-fallback` runs the job on CPU instead, with a
warning. A learner group of N ranks (`--learner-ranks`, or `policy.learn.multi_gpu`)
is checked here too: the job's batches must split over the ranks, and a CUDA job
needs a CUDA device for each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.config import ConfigError, JobConfig, deep_merge
from common.devices import (
    collectors_need_cuda,
    local_cuda,
    needs_cuda,
    role_device,
    role_needs_cuda,
)
from jobconfig import resolve_job_config
from jobconfig.ranks import split_error


@dataclass(frozen=True)
class LocalDevice:
    """The config to submit, and what was changed in it."""

    raw: dict[str, Any]
    config: JobConfig
    warnings: list[str] = field(default_factory=list)


def fit_local_device(raw: dict[str, Any], config: JobConfig, *, cpu_fallback: bool) -> LocalDevice:
    """`raw` (resolved as `config`) as this machine can run it.

    Args:
        cpu_fallback: without CUDA here, run a CUDA job on CPU (`policy.device: cpu`)
            with a warning, instead of refusing it.

    Raises:
        ConfigError: naming `policy.cuda` (or `policy.device`, or
            `policy.collect.device`), when the job needs CUDA, this machine has none
            and `cpu_fallback` is off.
    """
    policy = config.policy
    roles = [role for role in ("learner", "collector") if role_needs_cuda(policy, role)]
    if not roles:
        return LocalDevice(raw, config)
    # torch is asked only for a job that needs CUDA: a CPU run never waits for it
    # to load here.
    count, why_none = local_cuda()
    if count > 0:
        return LocalDevice(raw, config)
    device = role_device(policy, roles[0])
    if not cpu_fallback:
        raise ConfigError(
            device.key,
            f"{device.value} needs CUDA, but {why_none}, and `drover run` runs "
            f"every process here; set {device.lift}, or pass --cpu-fallback "
            "to run on CPU",
        )
    # `device` overrides `cuda`, so this one key moves the training to CPU; collectors
    # that asked for CUDA act where they can (`auto`: on CPU here).
    on_cpu_policy: dict[str, Any] = {"device": "cpu"}
    if collectors_need_cuda(policy):
        on_cpu_policy["collect"] = {"device": "auto"}
    on_cpu = deep_merge(raw, {"policy": on_cpu_policy})
    config, _ = resolve_job_config(on_cpu)
    warning = f"{device.key}: {device.value}, but {why_none}: running on CPU (--cpu-fallback)"
    return LocalDevice(on_cpu, config, [warning])


def local_learner_ranks(config: JobConfig, requested: int | None) -> tuple[int, list[str]]:
    """How many learner ranks `drover run` starts for the job, and what to tell the
    user about it.

    `--learner-ranks N` (`requested`) decides; without it a job with
    `policy.learn.multi_gpu: true` on CUDA gets one rank per CUDA device here, and any
    other job one learner.

    Raises:
        ConfigError: the job's batches do not split over the ranks, or a CUDA job
            asks for more ranks than this machine has CUDA devices.
    """
    policy = config.policy
    warnings: list[str] = []
    asked = "--learner-ranks" if requested is not None else "policy.learn.multi_gpu"
    if requested is None:
        requested = 1
        if policy.learn.multi_gpu and needs_cuda(policy):
            requested = max(1, local_cuda()[0])
        elif policy.learn.multi_gpu:
            warnings.append(
                "policy.learn.multi_gpu: true, but the job trains on CPU: one learner "
                "(pass --learner-ranks N for a group of N CPU ranks)"
            )
    if requested > 1 and needs_cuda(policy):
        count, why_none = local_cuda()
        if count < requested:
            raise ConfigError(
                asked,
                f"{requested} learner ranks on CUDA need {requested} CUDA devices, and "
                f"this machine has {count}{f' ({why_none})' if why_none else ''}",
            )
    error = split_error(policy, requested)
    if error is not None:
        raise ConfigError(*error)
    return requested, warnings
