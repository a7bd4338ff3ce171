"""`drover export`: a trained policy's acting network as ONNX or TorchScript, for use
outside drover, with a README of its inputs and outputs.

    drover export runs/cartpole_dqn-20261129-201500                 # its job's best policy
    drover export runs/.../job-1a2b/policies/00000012.safetensors --format torchscript
    drover export RUN --out exported/ --format onnx

RUN_OR_POLICY is a run folder holding one job, a job's folder (its best policy, else
its newest), or a policy file in a job's `policies/`. The network is the actor's own
(`acting()`, algorithms/export.py): observations in as the env gives them, the action
its evaluation would take out, with what it was chosen from. The algorithm's config
comes from the job's `job.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import ConfigError, JobConfig
from common.storage import CorruptFileError, PolicyFile, SharedStore
from drover.say import console, error

FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}


class ExportError(Exception):
    """What makes the export impossible, said in one line."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "export", help="a trained policy's acting network as ONNX or TorchScript"
    )
    parser.add_argument("source", type=Path, metavar="RUN_OR_POLICY")
    parser.add_argument("--format", choices=sorted(FORMATS), default="onnx")
    parser.add_argument(
        "--out", type=Path, default=None, help="the folder to write (default: <job>/export)"
    )


@dataclass
class Source:
    job_dir: Path
    config: JobConfig
    policy: PolicyFile
    #: The policy file, relative to the job's folder.
    path: str

    def actor(self) -> Any:
        """The job's algorithm's actor on the CPU, the policy loaded (what `drover
        export` and `drover enjoy` act with)."""
        from algorithms.registry import ALGORITHMS

        policy_config = dataclasses.replace(self.config.policy, cuda=False, device="cpu")
        actor = ALGORITHMS[self.policy.algo].make_actor(policy_config)
        actor.load(self.policy.version, self.policy.tensors)
        return actor


def run(args: argparse.Namespace) -> int:
    try:
        source = find_policy(args.source)
        out = args.out or source.job_dir / "export"
        written = export(source, args.format, out)
    except ExportError as exc:
        return error(str(exc))
    console.print(f"drover: {written} (and {written.parent / 'README.md'})", highlight=False)
    return 0


def find_policy(path: Path) -> Source:
    """The policy `path` names (the module's docstring), with its job's config."""
    if path.is_file():
        if path.suffix != ".safetensors" or path.parent.name != "policies":
            raise ExportError(f"{path}: not a policy file (<job>/policies/<version>.safetensors)")
        return read_source(path.parent.parent, f"policies/{path.name}")
    if not path.is_dir():
        raise ExportError(f"{path}: no such file or folder")
    if not (path / "job.json").is_file():
        jobs = sorted(p for p in path.iterdir() if (p / "job.json").is_file())
        if not jobs:
            raise ExportError(f"{path}: no job in it (a run folder, a job's folder, a policy)")
        if len(jobs) > 1:
            names = ", ".join(p.name for p in jobs[:5])
            raise ExportError(f"{path}: {len(jobs)} jobs in it ({names}): name one's folder")
        path = jobs[0]
    for pointer in ("best.json", "latest.json"):
        try:
            chosen = json.loads((path / "policies" / pointer).read_text())
        except (OSError, ValueError):
            continue
        name = str(chosen.get("path", "")).rsplit("/", 1)[-1]
        if name.endswith(".safetensors") and (path / "policies" / name).is_file():
            return read_source(path, f"policies/{name}")
    raise ExportError(f"{path}: the job has no policy to export (it never published one)")


def read_source(job_dir: Path, rel: str) -> Source:
    from algorithms.registry import ALGORITHMS
    from jobconfig import read_job_config

    store = SharedStore(job_dir.parent)
    try:
        config = read_job_config(store, job_dir.name)
    except (OSError, CorruptFileError, ConfigError) as exc:
        raise ExportError(f"{job_dir}: its config (job.json) cannot be read: {exc}") from None
    try:
        policy = store.read_policy(f"{job_dir.name}/{rel}")
    except (OSError, CorruptFileError) as exc:
        raise ExportError(f"{job_dir / rel}: not a policy file drover can read ({exc})") from None
    if policy.algo not in ALGORITHMS:
        raise ExportError(f"{job_dir / rel}: written by '{policy.algo}', no algorithm drover has")
    if policy.algo != config.policy.type:
        raise ExportError(
            f"{job_dir / rel}: written by algorithm '{policy.algo}', but its job's "
            f"policy.type is '{config.policy.type}'"
        )
    return Source(job_dir, config, policy, rel)


def export(source: Source, fmt: str, out: Path) -> Path:
    """Write the acting network in `fmt` and its README to `out`; the model's path."""
    import torch

    acting = source.actor().acting()
    example = tuple(example_input(port) for port in acting.inputs)
    out.mkdir(parents=True, exist_ok=True)
    target = out / FORMATS[fmt]
    with torch.no_grad():
        if fmt == "torchscript":
            torch.jit.trace(acting.module, example).save(str(target))
        else:
            export_onnx(acting, example, target)
    (out / "README.md").write_text(readme(source, acting, fmt, target.name))
    return target


def export_onnx(acting: Any, example: tuple, target: Path) -> None:
    import torch

    if importlib.util.find_spec("onnxscript") is None:  # torch's exporter needs it
        raise ExportError("--format onnx needs onnx and onnxscript: pip install 'drover[export]'")
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(
        acting.module,
        example,
        str(target),
        input_names=[p.name for p in acting.inputs],
        output_names=[p.name for p in acting.outputs],
        dynamic_shapes=tuple({0: batch} for _ in acting.inputs),
        dynamo=True,
        external_data=False,
        verbose=False,
    )


def example_input(port: Any) -> Any:
    import torch

    shape = [2 if axis == "batch" else int(axis) for axis in port.shape]
    return torch.zeros(shape, dtype=getattr(torch, port.dtype))


def readme(source: Source, acting: Any, fmt: str, name: str) -> str:
    def table(ports: tuple) -> list[str]:
        rows = ["| name | shape | dtype | what |", "|---|---|---|---|"]
        for p in ports:
            shape = "[" + ", ".join(str(axis) for axis in p.shape) + "]"
            rows.append(f"| `{p.name}` | {shape} | {p.dtype} | {p.meaning} |")
        return rows

    config = source.config
    run = (
        f'session = onnxruntime.InferenceSession("{name}")\n'
        f'outputs = session.run(None, {{"obs": obs}})'
        if fmt == "onnx"
        else f'module = torch.jit.load("{name}")\noutputs = module(torch.as_tensor(obs))'
    )
    lines = [
        f"# {config.exp_name}: {config.policy.type} on {config.env.env_id}",
        "",
        f"Job {source.job_dir.name}, policy version {source.policy.version} (train "
        f"iteration {source.policy.train_iter}), exported by `drover export` as {fmt}: "
        f"`{name}`. The action is the one drover's evaluation takes.",
        "",
        "Inputs:",
        "",
        *table(acting.inputs),
        "",
        "Outputs, in this order:",
        "",
        *table(acting.outputs),
        "",
        "```python",
        run,
        "action = outputs[0]",
        "```",
        "",
    ]
    return "\n".join(lines)
