"""Devices: what a worker has (it reports them at registration, in
`WorkerRegistration.resources`) and what a job's policy needs (`policy.cuda`,
`policy.device`).

torch is imported only inside the functions that ask it about this machine, so the
coordinator and the config reader, which use the rest, never import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.config import PolicyConfig

#: Registration resources: CUDA devices the worker's torch can use (0: none), and CPUs.
CUDA_DEVICES = "cuda_devices"
CPU_COUNT = "cpu_count"


def needs_cuda(policy: PolicyConfig) -> bool:
    """The job trains on CUDA: its learners need a CUDA device."""
    return policy.torch_device == "cuda"


def collectors_need_cuda(policy: PolicyConfig) -> bool:
    """The job acts only on CUDA (`policy.collect.device: cuda`): its collectors need a
    CUDA device. With `auto` (the default) a collector without one acts on CPU."""
    return policy.collect.device == "cuda"


def role_needs_cuda(policy: PolicyConfig, role: str) -> bool:
    """Whether a worker of `role` must have a CUDA device to take the job's tasks."""
    return needs_cuda(policy) if role == "learner" else collectors_need_cuda(policy)


def acting_device(policy: PolicyConfig, cuda_here: int) -> str:
    """The device a collector with `cuda_here` CUDA devices acts on for the job."""
    wanted = policy.collect.device
    if wanted == "cuda" or (wanted == "auto" and needs_cuda(policy) and cuda_here > 0):
        return "cuda"
    return "cpu"


@dataclass(frozen=True)
class RoleDevice:
    """How a role's need for CUDA reads in a message: the key that asks for it, its
    value as a user wrote it, and the setting that lifts the need."""

    key: str
    value: str
    lift: str


def role_device(policy: PolicyConfig, role: str) -> RoleDevice:
    """What asks a worker of `role` for CUDA in the job's config (`role_needs_cuda`)."""
    if role == "learner":
        return RoleDevice(device_key(policy), device_value(policy), cpu_setting(policy))
    return RoleDevice("policy.collect.device", "cuda", "policy.collect.device: auto")


def device_key(policy: PolicyConfig) -> str:
    """The config key that chose the device (`device` overrides `cuda`)."""
    return "policy.device" if policy.device is not None else "policy.cuda"


def device_value(policy: PolicyConfig) -> str:
    """The value of `device_key` as a user wrote it (``true``, ``cuda``)."""
    return policy.device if policy.device is not None else str(policy.cuda).lower()


def cpu_setting(policy: PolicyConfig) -> str:
    """The setting that runs the same job on CPU."""
    return "policy.device: cpu" if policy.device is not None else "policy.cuda: false"


def cuda_devices(resources: Mapping[str, Any]) -> int:
    """The CUDA devices a worker reported; 0 when it reported none (a worker that says
    nothing about its devices is not trusted with a CUDA job)."""
    value = resources.get(CUDA_DEVICES)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))


def local_cuda() -> tuple[int, str]:
    """CUDA devices torch can use in this process, and, when none, why not."""
    import torch  # here only: the callers that need no answer from torch never load it

    if torch.cuda.is_available():
        return torch.cuda.device_count(), ""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0, f"torch {torch.__version__} on this machine is built without CUDA"
    return 0, f"torch {torch.__version__} on this machine finds no CUDA device"


def local_resources() -> dict[str, int]:
    """What a slave on this machine reports at registration."""
    count, _ = local_cuda()
    return {CUDA_DEVICES: count, CPU_COUNT: os.cpu_count() or 1}
