"""Devices: what a worker has (it reports them at registration, in
`WorkerRegistration.resources`) and what a job's policy needs (`policy.cuda`,
`policy.device`).

torch is imported only inside the functions that ask it about this machine, so the
coordinator and the config reader, which use the rest, never import it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from common.config import PolicyConfig

#: Registration resources: CUDA devices the worker's torch can use (0: none), and CPUs.
CUDA_DEVICES = "cuda_devices"
CPU_COUNT = "cpu_count"


def needs_cuda(policy: PolicyConfig) -> bool:
    """The job trains and acts on CUDA: its learners and collectors need a CUDA device."""
    return policy.torch_device == "cuda"


def device_key(policy: PolicyConfig) -> str:
    """The config key that chose the device (`device` overrides `cuda`)."""
    return "policy.device" if policy.device is not None else "policy.cuda"


def device_value(policy: PolicyConfig) -> str:
    """The value of `device_key` as a user wrote it (``true``, ``cuda``)."""
    return policy.device if policy.device is not None else str(policy.cuda).lower()


def device_setting(policy: PolicyConfig) -> str:
    """The setting as a user wrote it, e.g. ``policy.cuda: true``."""
    return f"{device_key(policy)}: {device_value(policy)}"


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
