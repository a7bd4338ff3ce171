"""Adam on torch's fused kernel, without torch.optim's machinery.

torch.optim's optimizers import torch's compiler module (`torch._dynamo`) the first
time one adds a parameter group or steps, even when nothing is compiled: 1.2-1.4 s of
CPU on a 2-vCPU machine, on the way to a learner's first update and first policy
version (bench/whole_run.py --timeline). `FusedAdam` calls the same kernel
`torch.optim.Adam(fused=True)` calls (`torch._fused_adam_`, one kernel over all the
weights on the CPU and on CUDA) with the same arguments, so its steps are that Adam's,
bit for bit, and keeps its state as that Adam does: `state_dict()` has the same layout,
keys and dtypes, so a checkpoint written with either loads into the other.

It covers what drover's learners use: one parameter group, no weight decay, no
amsgrad, a skipped step when `found_inf` is set (GradScaler's mechanism, used by
`algorithms.step.device_step`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch

#: The hyper-parameters torch.optim.Adam keeps in a group, as it keeps them (its
#: state_dict's `param_groups`), for the arguments drover's learners pass it.
_GROUP_DEFAULTS: dict[str, Any] = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": True,
    "decoupled_weight_decay": False,
}


class Optimizer(Protocol):
    """What `algorithms.step` and the checkpoints use of an optimizer: torch.optim's
    optimizers and `FusedAdam` both are one."""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class FusedAdam:
    """torch.optim.Adam(params, lr, betas, eps, fused=True), without importing torch's
    compiler module.

    `found_inf`: when set (a 0-dim float tensor, 1.0 for "skip"), the next `step`
    leaves every weight, moment and step count as they were, as torch's fused Adam does
    with the attribute of the same name (set on the instance, then deleted).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("FusedAdam got no parameters")
        if not lr >= 0.0:
            raise ValueError(f"invalid learning rate: {lr}")
        group = {"lr": lr, "betas": betas, "eps": eps, **_GROUP_DEFAULTS}
        self.defaults = dict(group)
        self.param_groups = [{**group, "params": params}]
        #: Per parameter (once it has had a gradient): `step` (a 0-dim float32 tensor
        #: on its device, as the fused kernel wants it), `exp_avg`, `exp_avg_sq`.
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient."""
        group = self.param_groups[0]
        # Grouped by device and dtype: the kernel takes tensors of one of each.
        batches: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("FusedAdam does not support sparse gradients")
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
            lists = batches.setdefault((p.device, p.dtype), [[], [], [], [], []])
            for into, tensor in zip(
                lists,
                (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]),
                strict=True,
            ):
                into.append(tensor)
        beta1, beta2 = group["betas"]
        skip = getattr(self, "found_inf", None)
        for (device, _dtype), (params, grads, exp_avgs, exp_avg_sqs, steps) in batches.items():
            found_inf = None if skip is None else skip.to(device)
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                amsgrad=False,
                maximize=False,
                grad_scale=None,
                found_inf=found_inf,
            )
            if found_inf is not None:  # a skipped step does not count
                torch._foreach_sub_(steps, [found_inf] * len(steps))

    def state_dict(self) -> dict[str, Any]:
        """As torch.optim.Adam's: parameters by their index in the group."""
        params = self.param_groups[0]["params"]
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {
            "state": {i: dict(self.state[p]) for i, p in enumerate(params) if p in self.state},
            "param_groups": [{**group, "params": list(range(len(params)))}],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """From `state_dict()`, this class's or torch.optim.Adam's (fused or not): the
        moments on each parameter's device and dtype, the step count as a float32
        tensor on its device."""
        groups = state_dict["param_groups"]
        params = self.param_groups[0]["params"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(params):
            raise ValueError(
                "the loaded state does not fit this optimizer: "
                f"{[len(g['params']) for g in groups]} parameters in its groups, "
                f"{len(params)} here"
            )
        saved = groups[0]
        if saved.get("amsgrad") or saved.get("weight_decay") or saved.get("maximize"):
            raise ValueError("the loaded state is an Adam's with amsgrad, weight decay or maximize")
        by_index = dict(zip(saved["params"], params, strict=True))
        state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        for index, values in state_dict["state"].items():
            p = by_index[int(index)]
            step = torch.as_tensor(values["step"])
            state[p] = {
                "step": step.to(dtype=torch.float32, device=p.device).reshape(()).clone(),
                "exp_avg": values["exp_avg"].to(dtype=p.dtype, device=p.device).clone(),
                "exp_avg_sq": values["exp_avg_sq"].to(dtype=p.dtype, device=p.device).clone(),
            }
        self.state = state
        self.param_groups[0].update(lr=saved["lr"], betas=tuple(saved["betas"]), eps=saved["eps"])
