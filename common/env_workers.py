"""The `async` env manager: a collector's envs stepped in worker subprocesses.

`SubprocessVector` splits a vector of envs over worker processes that step their
shares at the same time, so env stepping uses more than one core. It gives the same
observations and rewards as `GymnasiumVector` (`sync`): each worker steps its share
with gymnasium's synchronous vector env, and env `i` of the whole vector is seeded
with `seed + i`, as gymnasium seeds it in one process.

Nothing crosses a process boundary as pickle (a project rule; gymnasium's
AsyncVectorEnv pickles commands and env factories over pipes):

- a worker is `python -m common.env_workers`, told its env config as JSON and made
  through `make_one_env`, which checks the config again;
- arrays (actions, observations, rewards, ends) stay in shared memory blocks that the
  parent creates, owns and unlinks; each worker maps them and uses its own rows;
- the worker's stdin and stdout carry one short JSON line per command and per answer:
  `make`, `attach`, `reset` with its seed, `step`; `{"ok": ...}` or `{"error": ...}`.
  Closing a worker's stdin stops it, and that is also what it sees when its parent
  dies. Its stderr is the parent's.

Every wait on a worker has a deadline, and a worker that exits is noticed at once (its
stdout ends). After any failure the vector closes itself (its workers would be out of
step with each other) and says which worker failed and why. Usage::

    envs = SubprocessVector(EnvConfig(env_id="PongNoFrameskip-v4"), 8)
    try:
        obs = envs.reset(seed=0)
        step = envs.step(actions)  # a VectorStep, as GymnasiumVector gives
    finally:
        envs.close()

`make_env` gives one for `env.manager: async`, with `env.num_workers` workers.

One module on purpose (about 560 lines): it holds both ends of one pipe protocol, the
parent (`SubprocessVector`) and the worker (`serve`; this module is what the worker
runs), which must agree on every command, answer and shared-memory layout (`_Layout`,
`_line`). Kept together, a command and the code that answers it are read side by side.
"""

from __future__ import annotations

import _posixshmem  # what SharedMemory opens blocks with; see _map_block
import contextlib
import dataclasses
import json
import mmap
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any, BinaryIO

import gymnasium as gym
import numpy as np
from pydantic import TypeAdapter

from common.config import ConfigError, EnvConfig
from common.env_guard import setup_env_registry
from common.envs import VectorStep, make_vector_env, usable_cpus

#: How long the workers may take to start and make their envs (Python start, env
#: packages, Atari ROMs; several workers share the cores while they start).
START_TIMEOUT_S = 120.0
#: How long one `reset` or `step` of all workers may take.
STEP_TIMEOUT_S = 60.0
#: How long `close` waits for a worker to close its envs and exit before killing it.
CLOSE_GRACE_S = 2.0

#: Rewards as gymnasium's vector envs give them.
_REWARD_DTYPE = np.dtype(np.float64)
#: The most of an error message a worker sends (its traceback is on stderr).
_MAX_MESSAGE_CHARS = 4000


class EnvWorkerError(RuntimeError):
    """An env worker failed, exited or did not answer in time; the vector is closed."""


@dataclass(frozen=True)
class _Share:
    """The envs `start` .. `stop - 1` of the vector, stepped by one worker."""

    index: int
    start: int
    stop: int

    @property
    def num_envs(self) -> int:
        return self.stop - self.start

    def __str__(self) -> str:
        return f"env worker {self.index} (envs {self.start}..{self.stop - 1})"


def _shares(num_envs: int, num_workers: int) -> list[_Share]:
    """Contiguous shares as even as can be, the first ones one env larger."""
    base, extra = divmod(num_envs, num_workers)
    shares, start = [], 0
    for index in range(num_workers):
        stop = start + base + (1 if index < extra else 0)
        shares.append(_Share(index, start, stop))
        start = stop
    return shares


@dataclass(frozen=True)
class _Layout:
    """The shapes and dtypes of one env's observation and action, as a worker reports
    them after making its envs."""

    obs_shape: tuple[int, ...]
    obs_dtype: str
    action_shape: tuple[int, ...]
    action_dtype: str

    @classmethod
    def of(cls, vector: gym.vector.VectorEnv) -> _Layout:
        obs, act = vector.single_observation_space, vector.single_action_space
        return cls(
            tuple(int(d) for d in obs.shape or ()),
            np.dtype(obs.dtype).name,
            tuple(int(d) for d in act.shape or ()),
            np.dtype(act.dtype).name,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Layout:
        return cls(
            tuple(int(d) for d in data["obs_shape"]),
            np.dtype(data["obs_dtype"]).name,
            tuple(int(d) for d in data["action_shape"]),
            np.dtype(data["action_dtype"]).name,
        )

    def arrays(self, num_envs: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The shape and dtype of each array of the vector, by the name of the shared
        block that holds it."""
        obs = ((num_envs, *self.obs_shape), np.dtype(self.obs_dtype))
        return {
            "actions": ((num_envs, *self.action_shape), np.dtype(self.action_dtype)),
            "obs": obs,
            "final_obs": obs,
            "reward": ((num_envs,), _REWARD_DTYPE),
            "terminated": ((num_envs,), np.dtype(np.bool_)),
            "truncated": ((num_envs,), np.dtype(np.bool_)),
        }


def _error_of(exc: BaseException) -> dict[str, Any]:
    """An exception as a worker answers it: a ConfigError keeps its field."""
    if isinstance(exc, ConfigError):
        return {"type": "ConfigError", "field": exc.field, "message": exc.message}
    return {"type": type(exc).__name__, "message": str(exc)[:_MAX_MESSAGE_CHARS]}


# --- the parent ------------------------------------------------------------------------


class _WorkerProcess:
    """The parent's end of one worker: its process, and its stdout read up to the end of
    each answer line."""

    def __init__(self, share: _Share, env: dict[str, str]) -> None:
        self.share = share
        self.process = subprocess.Popen(
            [sys.executable, "-m", "common.env_workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the parent's: a captured stderr would fill up and block the worker
            bufsize=0,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin = self.process.stdin
        self.stdin_fd = self.process.stdin.fileno()
        self.stdout_fd = self.process.stdout.fileno()
        self._pending = b""

    def send(self, request: bytes, doing: str) -> None:
        try:
            while request:  # a long request may go into the pipe in parts
                request = request[os.write(self.stdin_fd, request) :]
        except (BrokenPipeError, OSError):  # it has exited (or we closed the pipe)
            raise self._exited(doing) from None

    def read_available(self, doing: str) -> None:
        """Reads what the worker has written (the caller knows there is something)."""
        data = os.read(self.stdout_fd, 65536)
        if not data:
            raise self._exited(doing)
        self._pending += data

    def take_answer(self) -> dict[str, Any] | None:
        """The next whole answer line, if one has arrived."""
        line, newline, rest = self._pending.partition(b"\n")
        if not newline:
            return None
        self._pending = rest
        return json.loads(line)

    def _exited(self, doing: str) -> EnvWorkerError:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # its stdout closed, but it lives on
            return EnvWorkerError(f"{self.share} closed its stdout while {doing}")
        if code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        return EnvWorkerError(f"{self.share} {how} while {doing} (its stderr is above)")

    def stop(self, deadline: float) -> None:
        """Closes its stdin (which tells it to close its envs and exit), waits until the
        deadline, then kills it; always reaps it."""
        for pipe in (self.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _SharedBlocks:
    """The shared memory blocks of one vector, created and unlinked by the parent."""

    def __init__(self, arrays: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        # The pid in the name tells whose a block left in /dev/shm is.
        prefix = f"drover_{os.getpid()}_{secrets.token_hex(4)}"
        self._memories: list[SharedMemory] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[str, str] = {}
        try:
            for block, (shape, dtype) in arrays.items():
                nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
                memory = SharedMemory(f"{prefix}_{block}", create=True, size=nbytes)
                self._memories.append(memory)
                self.arrays[block] = np.ndarray(shape, dtype, buffer=memory.buf)
                self.names[block] = memory.name
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        self.arrays.clear()  # the views go first: a block with views cannot be closed
        for memory in self._memories:
            try:
                memory.close()
            finally:
                memory.unlink()
        self._memories.clear()


class SubprocessVector:
    """`num_envs` envs stepped by `config.num_workers` worker subprocesses (None: one
    per CPU, at most one per env); a `VectorEnvAdapter`.

    Raises (from the constructor, `reset` and `step`):
        ConfigError: a worker refused the env config, as `make_one_env` refuses it.
        EnvWorkerError: a worker failed, exited or did not answer in time. The vector
            is then closed.
    """

    def __init__(
        self,
        config: EnvConfig,
        num_envs: int,
        *,
        training: bool = True,
        start_timeout_s: float = START_TIMEOUT_S,
        step_timeout_s: float = STEP_TIMEOUT_S,
        close_grace_s: float = CLOSE_GRACE_S,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, not {num_envs}")
        self.num_envs = num_envs
        self.step_timeout_s = step_timeout_s
        self.close_grace_s = close_grace_s
        self._workers: list[_WorkerProcess] = []
        self._blocks: _SharedBlocks | None = None
        self._closed = False
        num_workers = config.num_workers or usable_cpus()
        self._shares = _shares(num_envs, min(num_workers, num_envs))
        try:
            config_json = _config_json(config)
            env = _worker_environ()
            for share in self._shares:
                self._workers.append(_WorkerProcess(share, env))
                make = _line("make", config=config_json, num_envs=share.num_envs, training=training)
                self._workers[-1].send(make, "starting")
            answers = self._answers("making its envs", start_timeout_s)
            layouts = {_Layout.from_json(answer) for answer in answers}
            if len(layouts) != 1:
                raise EnvWorkerError(f"the env workers made envs of different spaces: {layouts}")
            (layout,) = layouts
            self._blocks = _SharedBlocks(layout.arrays(num_envs))
            self._arrays = self._blocks.arrays
            for worker in self._workers:
                blocks, start = self._blocks.names, worker.share.start
                attach = _line("attach", blocks=blocks, total=num_envs, start=start)
                worker.send(attach, "attaching shared memory")
            self._answers("attaching shared memory", start_timeout_s)
        except BaseException:
            self._release(grace_s=0.0)
            raise

    @property
    def pids(self) -> tuple[int, ...]:
        """The workers' process ids, in env order."""
        return tuple(worker.process.pid for worker in self._workers)

    def reset(self, seed: int | None) -> np.ndarray:
        """Resets every env; env `i` gets `seed + i` (None: fresh random seeds)."""
        self._check_open()
        try:
            for worker in self._workers:
                env_seed = None if seed is None else seed + worker.share.start
                worker.send(_line("reset", seed=env_seed), "resetting")
            self._answers("resetting", self.step_timeout_s)
            return self._arrays["obs"].copy()
        except BaseException:
            self._release(grace_s=0.0)
            raise

    def step(self, actions: np.ndarray) -> VectorStep:
        """Steps every env with its action (`actions[i]` for env `i`); an env whose
        episode ended is reset in the same step, as `GymnasiumVector` does."""
        self._check_open()
        actions = np.asarray(actions)
        shared_actions = self._arrays["actions"]
        if actions.shape != shared_actions.shape:
            raise ValueError(
                f"actions of shape {list(actions.shape)} for {self.num_envs} envs; "
                f"expected {list(shared_actions.shape)}"
            )
        np.copyto(shared_actions, actions, casting="same_kind")
        try:
            for worker in self._workers:
                worker.send(_STEP, "stepping")
            self._answers("stepping", self.step_timeout_s)
        except BaseException:
            self._release(grace_s=0.0)
            raise
        # Copies: the next step overwrites the shared arrays.
        obs = self._arrays["obs"].copy()
        terminated = self._arrays["terminated"].copy()
        truncated = self._arrays["truncated"].copy()
        ended = terminated | truncated
        final_obs = obs
        if ended.any():
            # Workers write a final observation only for the envs that ended.
            final_obs = obs.copy()
            final_obs[ended] = self._arrays["final_obs"][ended]
        return VectorStep(obs, self._arrays["reward"].copy(), terminated, truncated, final_obs)

    def close(self) -> None:
        """Stops the workers (killing any that do not exit within `close_grace_s`) and
        frees the shared memory. Idempotent."""
        self._release(grace_s=self.close_grace_s)

    def __enter__(self) -> SubprocessVector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EnvWorkerError("the env workers are closed")

    def _answers(self, doing: str, timeout_s: float) -> list[dict[str, Any]]:
        """Each worker's answer to the request just sent to all of them, in worker order,
        waiting for all at once until the deadline.

        Raises:
            ConfigError: a worker refused the env config.
            EnvWorkerError: a worker answered with an error, exited, or did not answer.
        """
        deadline = time.monotonic() + timeout_s
        answers: dict[int, dict[str, Any]] = {}
        with selectors.DefaultSelector() as selector:
            for worker in self._workers:
                selector.register(worker.stdout_fd, selectors.EVENT_READ, worker)
            while len(answers) < len(self._workers):
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    late = [str(w.share) for w in self._workers if w.share.index not in answers]
                    raise EnvWorkerError(
                        f"{', '.join(late)} did not finish {doing} within {timeout_s:g} s"
                    )
                for key, _ in selector.select(remaining_s):
                    worker = key.data
                    worker.read_available(doing)
                    answer = worker.take_answer()
                    if answer is None:
                        continue
                    selector.unregister(key.fd)
                    if "error" in answer:
                        raise _raised(answer["error"], worker.share, doing)
                    answers[worker.share.index] = answer["ok"]
        return [answers[worker.share.index] for worker in self._workers]

    def _release(self, grace_s: float) -> None:
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + grace_s
        try:
            for worker in self._workers:
                worker.stop(deadline)
        finally:
            if self._blocks is not None:
                self._blocks.release()


def _line(cmd: str, **fields: Any) -> bytes:
    """A request: one JSON line."""
    return (json.dumps({"cmd": cmd, **fields}) + "\n").encode()


_STEP = _line("step")


def _config_json(config: EnvConfig) -> dict[str, Any]:
    data = dataclasses.asdict(config)
    try:
        json.dumps(data, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError("env.env_kwargs", f"must hold JSON values only: {exc}") from None
    return data


def _worker_environ() -> dict[str, str]:
    """The parent's environment, with the root of this `common` package first on the
    worker's import path, so that the worker runs the same code as its parent wherever
    the parent found it."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _raised(error: dict[str, Any], share: _Share, doing: str) -> Exception:
    if error.get("type") == "ConfigError":
        return ConfigError(str(error.get("field")), str(error.get("message")))
    return EnvWorkerError(f"{share} failed {doing}: {error.get('type')}: {error.get('message')}")


# --- the worker ------------------------------------------------------------------------


def _map_block(name: str) -> mmap.mmap:
    """Maps the parent's block `name`.

    Not through SharedMemory: in Python 3.11 it registers every block it opens with a
    resource tracker, which unlinks the block when this process exits, while the block
    is the parent's to unlink (`track=False` came in Python 3.13).
    """
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


class _EnvWorker:
    """A worker's envs, and its rows of the shared arrays."""

    def __init__(self) -> None:
        self.vector: gym.vector.VectorEnv | None = None
        self.rows: dict[str, np.ndarray] = {}

    def make(self, config: dict[str, Any], num_envs: int, training: bool) -> dict[str, Any]:
        setup_env_registry()  # the parent's DROVER_ENV_MODULES, inherited
        env_config = TypeAdapter(EnvConfig).validate_python(config)
        self.vector = make_vector_env(env_config, num_envs, training=training)
        return dataclasses.asdict(_Layout.of(self.vector))

    def attach(self, blocks: dict[str, str], total: int, start: int) -> dict[str, Any]:
        assert self.vector is not None, "attach before make"
        arrays = _Layout.of(self.vector).arrays(total)
        stop = start + self.vector.num_envs
        for block, (shape, dtype) in arrays.items():
            whole = np.ndarray(shape, dtype, buffer=_map_block(blocks[block]))
            self.rows[block] = whole[start:stop]
        return {}

    def reset(self, seed: int | None) -> dict[str, Any]:
        assert self.vector is not None and self.rows, "reset before attach"
        obs, _ = self.vector.reset(seed=seed)
        self.rows["obs"][...] = obs
        return {}

    def step(self) -> dict[str, Any]:
        assert self.vector is not None and self.rows, "step before attach"
        rows = self.rows
        # A copy: an env may keep its action, and the parent writes the next ones here.
        obs, reward, terminated, truncated, info = self.vector.step(rows["actions"].copy())
        rows["obs"][...] = obs
        rows["reward"][...] = reward
        rows["terminated"][...] = terminated
        rows["truncated"][...] = truncated
        for i in np.flatnonzero(terminated | truncated):
            rows["final_obs"][i] = info["final_obs"][i]
        return {}

    def close(self) -> None:
        if self.vector is not None:
            self.vector.close()


def serve(requests: Iterable[bytes], answers: BinaryIO) -> int:
    """Answers the parent's requests until they end (the parent closed our stdin or
    died), or until one fails: then the error is the last answer.

    Returns:
        The exit status: 0 when the requests ended, 1 after an error.
    """
    worker = _EnvWorker()
    handlers: dict[str, Callable[..., dict[str, Any]]] = {
        "make": worker.make,
        "attach": worker.attach,
        "reset": worker.reset,
        "step": worker.step,
    }
    try:
        for line in requests:
            try:
                fields = json.loads(line)
                answer: dict[str, Any] = {"ok": handlers[fields.pop("cmd")](**fields)}
            except Exception as exc:
                if not isinstance(exc, ConfigError):
                    traceback.print_exc()  # the whole story on stderr, the parent's
                answers.write((json.dumps({"error": _error_of(exc)}) + "\n").encode())
                return 1
            answers.write((json.dumps(answer) + "\n").encode())
        return 0
    finally:
        worker.close()


def main() -> int:
    # The parent handles Ctrl-C and closes us; a worker's own KeyboardInterrupt would
    # only print a traceback in the middle of the parent's shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Answers go to a private copy of stdout, and stdout itself becomes stderr, so that
    # whatever env code prints (from Python or C) cannot corrupt the answers.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    sys.exit(main())
