"""The one optimizer step every learner takes, guarded against non-finite values and,
in a learner group, averaged across its ranks.

A NaN or inf loss from one batch would reach every weight, and the optimizer's
moments, in a single step; such a batch is skipped instead (the caller counts it).
In a learner group the ranks decide together (`algorithms.sync`): a rank whose loss
is not finite makes every rank skip, so the ranks never drift apart.

Usage::

    grad_norm = finite_step(loss, optimizer, model.parameters(), max_grad_norm, sync=self.sync)
    if grad_norm is None:
        self.skipped_updates += 1

On a GPU each of `finite_step`'s checks waits for the device. `device_step` takes the
same step without waiting (a skipped step is skipped on the device), and the learner
reads its norm with everything else it reports in one transfer (`to_host`)::

    norm = device_step(loss, optimizer, model.parameters(), max_grad_norm, sync=self.sync)
    scalars, td_abs = to_host({"loss": loss, "grad_norm": norm}, td.abs())
    if math.isnan(scalars["grad_norm"]):
        self.skipped_updates += 1
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch.optim import Optimizer

from algorithms.sync import LOCAL, GradientSync

#: Devices whose torch.optim.Adam has the fused implementation drover uses.
FUSED_DEVICES = frozenset({"cpu", "cuda"})


def adam(parameters: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """The Adam every learner uses: torch's fused implementation where the weights'
    device has one (one kernel over all the weights: several times faster than the
    per-tensor loop on the CPU, and the optimizer step is work every rank of a learner
    group does in full), torch's default elsewhere.

    torch.optim imports torch's compiler module with an optimizer's first parameter
    group (about 1.3 s of CPU on a 2-vCPU machine): a learner's process does that on a
    thread of its own as it starts (`warm_up_soon`), while it registers and waits for
    its first task, not on the way to its first update."""
    params = list(parameters)
    fused = all(p.device.type in FUSED_DEVICES for p in params) or None
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=fused)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A checkpoint's optimizer state (moments, step counts), at the learning rates
    the optimizer was made with: the job's config, not the checkpoint's, says how fast
    to learn (a member of population-based training resumes a better member's
    checkpoint with learning rates of its own)."""
    rates = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, lr in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = lr


def warm_up_soon() -> threading.Thread:
    """`warm_up` on a daemon thread, started now."""
    thread = threading.Thread(target=warm_up, name="optimizer-warm-up", daemon=True)
    thread.start()
    return thread


def warm_up() -> None:
    """Make an optimizer and step it once, so that what torch.optim imports lazily (at
    the first parameter group, and at the first step) is imported. On a parameter of
    no element: no operator starts torch's thread pools."""
    parameter = torch.nn.Parameter(torch.empty(0))
    optimizer = adam([parameter], lr=0.0)
    parameter.grad = torch.zeros_like(parameter)
    optimizer.step()


def finite_step(
    loss: torch.Tensor,
    optimizer: Optimizer,
    parameters: Iterable[torch.Tensor] = (),
    max_grad_norm: float | None = None,
    *,
    sync: GradientSync = LOCAL,
) -> float | None:
    """Backpropagate `loss` and step `optimizer`, clipping the gradient norm of
    `parameters` when `max_grad_norm` is set. Returns the gradient's L2 norm before
    clipping (of `parameters` when clipping, else of every parameter `optimizer`
    updates), or None, having changed nothing, when the loss or that norm is not finite.

    With a `sync` of several ranks, the gradients of every parameter `optimizer`
    updates are averaged across them before clipping, so the clipped norm and the
    step are the same on every rank.
    """
    optimizer.zero_grad(set_to_none=True)
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    # Reading the loss's check on the host waits for the forward pass (on CUDA, the
    # step's first wait for the device), so a non-finite loss is never backpropagated.
    # In a learner group, `sync.backward` also waits for its one-number all-reduce.
    finite = sync.backward(loss, owned, bool(torch.isfinite(loss.detach())))
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return None
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in owned if p.grad is not None])
    # Reading the norm on the host waits for backward and the clipping (on CUDA, the
    # step's second wait for the device).
    grad_norm = float(norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    return grad_norm


def device_step(
    loss: torch.Tensor,
    optimizer: Optimizer,
    parameters: Iterable[torch.Tensor] = (),
    max_grad_norm: float | None = None,
    *,
    sync: GradientSync = LOCAL,
) -> torch.Tensor:
    """`finite_step` without waiting for the device: returns the gradient norm as a
    0-dim tensor on the device, NaN when the step was skipped (the loss or the norm was
    not finite), for the caller to read with its other values in one transfer
    (`to_host`).

    On an accelerator, in one process, with a fused optimizer, the step is skipped on
    the device itself (`scaled_step`). On the CPU, where reading a value waits for
    nothing, in a learner group, whose ranks decide together on the host, and with an
    optimizer that cannot skip on the device, this is `finite_step`.
    """
    if sync is LOCAL and loss.device.type != "cpu" and optimizer.defaults.get("fused"):
        return scaled_step(loss, optimizer, parameters, max_grad_norm)
    norm = finite_step(loss, optimizer, parameters, max_grad_norm, sync=sync)
    return torch.tensor(math.nan if norm is None else norm, device=loss.device)


#: Each optimizer's GradScaler (`scaled_step`), made with its first step.
_SCALERS: weakref.WeakKeyDictionary[Optimizer, torch.amp.GradScaler] = weakref.WeakKeyDictionary()


def scaled_step(
    loss: torch.Tensor,
    optimizer: Optimizer,
    parameters: Iterable[torch.Tensor] = (),
    max_grad_norm: float | None = None,
) -> torch.Tensor:
    """`device_step` through torch's GradScaler, kept at a scale of 1 (so the
    gradients are never scaled): when the loss or the gradient norm is not finite, the
    gradients are made NaN on the device, GradScaler finds them so, and a fused
    optimizer skips the step in its kernel (weights, moments and step count as they
    were), so nothing is read on the host. A non-finite loss is backpropagated, but
    its gradients are never applied, and the next step's `zero_grad` drops them."""
    scaler = _SCALERS.get(optimizer)
    if scaler is None:
        scaler = _SCALERS[optimizer] = torch.amp.GradScaler(loss.device.type, init_scale=1.0)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in owned if p.grad is not None]
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    else:
        norm = torch.nn.utils.get_total_norm(grads)
    finite = torch.isfinite(loss.detach()) & torch.isfinite(norm)
    # A loss or norm that is not finite with finite gradients (an infinite norm the
    # clipping scaled to zero, a NaN term that no weight depends on) skips too.
    poison = torch.where(finite, 1.0, math.nan).to(norm.dtype)
    for grad in grads:
        grad.mul_(poison)
    try:
        scaler.step(optimizer)
    except BaseException:
        del _SCALERS[optimizer]  # its state is mid-step: the next step starts a new one
        raise
    scaler.update(new_scale=1.0)  # no loss scaling: only the check and the skip
    return torch.where(finite, norm.detach(), torch.full_like(norm, math.nan))


def to_host(
    values: dict[str, torch.Tensor], vector: torch.Tensor
) -> tuple[dict[str, float], np.ndarray]:
    """Scalar tensors as floats and a vector as a numpy array, read from the device in
    one transfer (on the CPU, where there is nothing to wait for, as they are)."""
    vector = vector.detach()
    if vector.device.type == "cpu":
        return {k: float(v.detach()) for k, v in values.items()}, vector.numpy()
    head = torch.stack([v.detach().reshape(()).float() for v in values.values()])
    host = torch.cat([head, vector.reshape(-1).float()]).cpu().numpy()
    return dict(zip(values, host[: len(values)].tolist(), strict=True)), host[len(values) :]


@dataclass(frozen=True)
class TDReport:
    """A TD learner's update (algorithms.base.BatchReport): its loss, mean value
    estimate, the items' new priorities and its TensorBoard tags."""

    loss: float
    q_mean: float
    #: Per item: the new priority (|TD error|; a sequence's mix of its steps').
    td_abs: np.ndarray
    scalars: dict[str, float]


def td_report(
    on_device: dict[str, torch.Tensor], td_abs: torch.Tensor, optimizer: Optimizer
) -> tuple[TDReport, bool]:
    """An update's report from its tags still on the device (`loss/td`, `value/q_mean`,
    `optim/grad_norm`, ...: read in one transfer) and the items' priorities, with the
    optimizer's learning rate; and whether the update was skipped (a NaN gradient norm:
    `finite_step` took no step)."""
    scalars, td_host = to_host(on_device, td_abs)
    skipped = math.isnan(scalars["optim/grad_norm"])
    scalars["optim/learning_rate"] = learning_rate(optimizer)
    report = TDReport(scalars["loss/td"], scalars["value/q_mean"], td_host, scalars)
    return report, skipped


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch's column as a tensor on `device`. To a GPU it goes from pinned memory,
    asynchronously: a copy from pageable memory is staged through a pinned buffer by
    the driver and blocks the host; pinned buffers come from torch's caching host
    allocator, which keeps each one until its copy has run."""
    tensor = torch.as_tensor(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def learning_rate(optimizer: Optimizer) -> float:
    """The optimizer's learning rate now (its first parameter group's)."""
    return float(optimizer.param_groups[0]["lr"])


def to_floats(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Scalar tensors as floats, read from the device in one transfer (each `float()`
    on a CUDA tensor would wait for the device once)."""
    if not values:
        return {}
    if next(iter(values.values())).device.type == "cpu":  # no transfer to save: cheaper
        return {k: float(v.detach()) for k, v in values.items()}
    stacked = torch.stack([v.detach().reshape(()).float() for v in values.values()])
    return dict(zip(values, stacked.cpu().tolist(), strict=True))
