"""DI-engine configs, read as their authors meant or refused with the reason.

A DI-engine config file holds `main_config` (the settings) and `create_config` (what
to build: `policy.type`, `env.type`). drover reads both: the algorithm and the env
come from `create_config`, and the knobs DI-engine names differently are moved to
drover's keys. Each move is reported as a note; an algorithm or env drover cannot
run is an error naming the key, so a config never trains something else than it
asks for.

    raw, notes = from_di_engine(main_config, create_config)
    config, warnings = resolve_job_config(raw)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from algorithms.registry import ALGORITHMS
from common.config import ConfigError

#: DI-engine's `create_config.env.type` -> the gymnasium id drover makes. DI-engine's
#: cartpole is gymnasium's v0 (200 steps, goal 195), not v1.
ENV_TYPES: dict[str, str] = {
    "cartpole": "CartPole-v0",
    "pendulum": "Pendulum-v1",
    "acrobot": "Acrobot-v1",
    "mountain_car": "MountainCar-v0",
    "lunarlander": "LunarLander-v3",
    "bipedalwalker": "BipedalWalker-v3",
}

#: Env ids DI-engine configs name that gymnasium has renamed.
ENV_IDS: dict[str, str] = {
    "LunarLander-v2": "LunarLander-v3",
    "LunarLanderContinuous-v2": "LunarLanderContinuous-v3",
    "BipedalWalker-v2": "BipedalWalker-v3",
}


#: Algorithms drover does not run, with what to use instead. DI-engine's
#: `create_config.policy.type` names a registered algorithm by its own name.
NOT_SUPPORTED: dict[str, str] = {
    "discrete_sac": "drover's sac needs continuous (Box) actions; for discrete actions "
    "use dqn or ppo",
    "sac_discrete": "drover's sac needs continuous (Box) actions; for discrete actions "
    "use dqn or ppo",
    "ppo_offpolicy": "drover's ppo is on-policy (the sync workflow: each round trains on "
    "its own data once); set create_config.policy.type: ppo",
}

#: DI-engine keys drover has under another name: (from, to), dotted paths in the
#: config. A key is moved only when drover's is not set too.
MOVES: tuple[tuple[str, str], ...] = (
    ("policy.learn.discount_factor", "policy.discount_factor"),
    ("policy.collect.discount_factor", "policy.discount_factor"),
    ("policy.unroll_len", "policy.collect.unroll_len"),
    ("policy.random_collect_size", "policy.collect.random_collect_size"),
    ("policy.learn.rho_clip_ratio", "policy.learn.rho_clip"),
    ("policy.learn.c_clip_ratio", "policy.learn.c_clip"),
    # Newer DI-engine configs put it on the policy; the meaning is the same.
    ("policy.multi_gpu", "policy.learn.multi_gpu"),
)


#: DI-engine key names whose drover key has another name: what to set instead (told
#: to whoever writes them in a YAML config; a DI-engine .py file is translated).
RENAMED: dict[str, str] = {
    "update_per_collect": "policy.other.replay_buffer.samples_per_insert "
    "(= update_per_collect x batch_size / n_sample)",
    "priority": "policy.other.replay_buffer.type: prioritized",
    "rho_clip_ratio": "policy.learn.rho_clip",
    "c_clip_ratio": "policy.learn.c_clip",
}


def from_di_engine(
    main_config: dict[str, Any], create_config: dict[str, Any] | None
) -> tuple[dict[str, Any], list[str]]:
    """drover's raw config for a DI-engine (main_config, create_config) pair.

    Returns:
        The raw config (for `resolve_job_config`) and a note for each translation.

    Raises:
        ConfigError: naming the key when the algorithm or the env cannot be run.
    """
    notes: list[str] = []
    raw = _data_only(main_config, "", notes)
    create = create_config or {}
    for extra in ("reward_model", "world_model"):
        if extra in raw or extra in create:
            # Training without it would be another experiment than the file's.
            raise ConfigError(
                extra,
                f"drover trains no {extra.replace('_', ' ')} (GAIL, RND, TREX, "
                f"guided cost, model-based RL); remove {extra} from main_config and "
                "create_config to train the plain algorithm",
            )
    _algorithm(raw, _get(create, "policy.type"), notes)
    _env(raw, _get(create, "env.type"), notes)
    for source, target in MOVES:
        if _own_key(raw, source):
            continue
        _move(raw, source, target, notes)
    _sequences(raw, notes)
    _replay_ratio(raw, notes)
    _priority(raw, notes)
    envs = _get(raw, "env.collector_env_num")
    if envs is not None:
        notes.append(
            f"env.collector_env_num {envs} is per collector in drover (DI-engine: in all); "
            "with N collectors, N x that many envs step at once"
        )
    if _get(raw, "policy.model.action_space") == "reparameterization":
        # DI-engine's name for a squashed Gaussian actor: drover reads the action
        # space from the env.
        _pop(raw, "policy.model.action_space")
        notes.append("policy.model.action_space: reparameterization is SAC's actor; dropped")
    # DI-engine's files carry many keys drover has no use for: each is a warning.
    raw.setdefault("strict", False)
    return raw, notes


def _data_only(value: Any, path: str, notes: list[str]) -> Any:
    """A copy holding JSON data only: a Python object in a config (DI-engine's
    `activation=nn.Tanh()`) is passed on as its name, and said so; a key drover knows
    then refuses it by name, and one it does not know is warned about as usual."""
    if isinstance(value, dict):
        return {k: _data_only(v, f"{path}{k}.", notes) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_data_only(v, path, notes) for v in value]
    if value is None or isinstance(value, str | bool | int | float):
        return value
    name = repr(value)
    # DI-engine's model activation (`nn.ReLU()`): PPO's `policy.model.activation`.
    activation = name.removeprefix("nn.").removesuffix("()").lower()
    if path == "policy.model.activation." and activation in ("tanh", "relu"):
        notes.append(f"policy.model.activation: {name} is {activation!r}")
        return activation
    notes.append(f"{path.rstrip('.')}: a Python object ({value!r}), passed on as its name")
    return name


def _algorithm(raw: dict[str, Any], policy_type: Any, notes: list[str]) -> None:
    if policy_type is None:
        return
    name = str(policy_type)
    if name in NOT_SUPPORTED:
        raise ConfigError("create_config.policy.type", f"'{name}': {NOT_SUPPORTED[name]}")
    if name not in ALGORITHMS:
        known = ", ".join(sorted(ALGORITHMS))
        raise ConfigError(
            "create_config.policy.type", f"'{name}' is not an algorithm drover runs ({known})"
        )
    algorithm = name
    given = _get(raw, "policy.type")
    if given is not None and given != algorithm:
        raise ConfigError(
            "policy.type", f"'{given}' contradicts create_config.policy.type '{name}'"
        )
    _set(raw, "policy.type", algorithm)
    notes.append(f"create_config.policy.type {name} -> policy.type {algorithm}")


def _env(raw: dict[str, Any], env_type: Any, notes: list[str]) -> None:
    manager = _get(raw, "env.manager")
    if isinstance(manager, dict):
        # DI-engine's env manager settings (shared_memory, retries, ...) have no
        # counterpart: drover's env.manager names how envs are stepped.
        _pop(raw, "env.manager")
        notes.append(
            "env.manager ignored: DI-engine's manager settings; drover's env.manager "
            "is sync, async or envpool (default sync)"
        )
    env_id = _get(raw, "env.env_id")
    if env_id in ENV_IDS:
        _set(raw, "env.env_id", ENV_IDS[env_id])
        notes.append(f"env.env_id {env_id} -> {ENV_IDS[env_id]} (gymnasium's current id)")
        return
    if env_id is not None or env_type is None:
        return
    name = str(env_type)
    if name not in ENV_TYPES:
        known = ", ".join(sorted(ENV_TYPES))
        raise ConfigError(
            "create_config.env.type",
            f"'{name}' is not an env type drover maps ({known}); set env.env_id "
            "to a gymnasium id instead",
        )
    _set(raw, "env.env_id", ENV_TYPES[name])
    notes.append(f"create_config.env.type {name} -> env.env_id {ENV_TYPES[name]}")


def _replay_ratio(raw: dict[str, Any], notes: list[str]) -> None:
    """`update_per_collect` batches after every `n_sample` collected steps is a
    replay ratio: update_per_collect x batch_size / n_sample samples per insert."""
    updates = _pop(raw, "policy.learn.update_per_collect")
    if updates is None:
        return
    algorithm = ALGORITHMS.get(str(_get(raw, "policy.type") or "dqn"))
    if algorithm is not None and algorithm.collect_unit == "rounds":
        notes.append(
            f"policy.learn.update_per_collect ignored: drover's {algorithm.name} trains "
            "epoch_per_collect passes over each round"
        )
        return
    defaults = algorithm.defaults if algorithm is not None else {}
    sampler = _get(raw, "policy.other.replay_buffer.type") or _get(
        defaults, "policy.other.replay_buffer.type"
    )
    if sampler == "fifo":
        notes.append(
            "policy.learn.update_per_collect ignored: the fifo buffer hands out each "
            "item once, so there is no replay ratio to keep"
        )
        return
    batch_size = _get(raw, "policy.learn.batch_size")
    n_sample = _get(raw, "policy.collect.n_sample")
    target = "policy.other.replay_buffer.samples_per_insert"
    if not all(isinstance(v, int | float) and v > 0 for v in (updates, batch_size, n_sample)):
        notes.append(
            "policy.learn.update_per_collect ignored: it needs policy.learn.batch_size "
            "and policy.collect.n_sample to give a replay ratio"
        )
        return
    if _get(raw, target) is not None:
        notes.append(f"policy.learn.update_per_collect ignored: {target} is set")
        return
    ratio = updates * batch_size / n_sample
    _set(raw, target, ratio)
    notes.append(
        f"policy.learn.update_per_collect {updates} -> {target} {ratio:g} "
        f"({updates} x batch_size {batch_size} / n_sample {n_sample})"
    )


def _priority(raw: dict[str, Any], notes: list[str]) -> None:
    priority = _pop(raw, "policy.priority")
    _pop(raw, "policy.priority_IS_weight")  # drover's prioritized replay always weighs
    target = "policy.other.replay_buffer.type"
    if priority is True and _get(raw, target) is None:
        _set(raw, target, "prioritized")
        notes.append(f"policy.priority true -> {target} prioritized")


def _own_key(raw: dict[str, Any], path: str) -> bool:
    """Whether the job's algorithm has `path` itself (R2D2's `policy.unroll_len`, the
    learned steps of a sequence), so DI-engine's key means what drover's does."""
    algorithm = ALGORITHMS.get(str(_get(raw, "policy.type")))
    if algorithm is None or not path.startswith("policy."):
        return False
    fields = {f.name for f in dataclasses.fields(algorithm.config)}
    return path.split(".")[1] in fields and path.count(".") == 1


def _sequences(raw: dict[str, Any], notes: list[str]) -> None:
    """A recurrent algorithm's sequences (R2D2): DI-engine derives the replayed
    sequence from `burnin_step + unroll_len`, drover's buffer names it; and its
    exploration is Ape-X's per-env epsilons, not DI-engine's decaying one."""
    algorithm = ALGORITHMS.get(str(_get(raw, "policy.type")))
    if algorithm is None or not algorithm.recurrent:
        return
    defaults = algorithm.config()
    burnin = _get(raw, "policy.burnin_step")
    unroll = _get(raw, "policy.unroll_len")
    nstep = _get(raw, "policy.nstep")
    burnin = defaults.burnin_step if burnin is None else burnin  # type: ignore[attr-defined]
    unroll = defaults.unroll_len if unroll is None else unroll  # type: ignore[attr-defined]
    nstep = defaults.nstep if nstep is None else nstep  # type: ignore[attr-defined]
    if isinstance(burnin, int) and isinstance(unroll, int) and isinstance(nstep, int):
        buffer = "policy.other.replay_buffer"
        if _get(raw, f"{buffer}.sequence_length") is None:
            length = burnin + unroll
            # Half, as R2D2's, but at least what has every step learned by some sequence
            # (its burn-in and last nstep rows are not); below the length, so an nstep
            # too long for the sequences is the error the config check names.
            overlap = min(max(length // 2, burnin + nstep), length - 1)
            _set(raw, f"{buffer}.item", "sequence")
            _set(raw, f"{buffer}.sequence_length", length)
            _set(raw, f"{buffer}.overlap", overlap)
            notes.append(
                f"{buffer}: sequences of burnin_step + unroll_len = {length} steps, "
                f"consecutive ones sharing {overlap} (at least burnin_step + nstep)"
            )
    eps = _get(raw, "policy.other.eps")
    if isinstance(eps, dict) and any(k in eps for k in ("type", "start", "end", "decay")):
        _pop(raw, "policy.other.eps")
        notes.append(
            "policy.other.eps: r2d2 explores with Ape-X's fixed epsilon per env "
            "(policy.other.eps.base, alpha); the decaying schedule is dropped"
        )


def _move(raw: dict[str, Any], source: str, target: str, notes: list[str]) -> None:
    value = _get(raw, source)
    if value is None:
        return
    _pop(raw, source)
    if _get(raw, target) is not None:
        notes.append(f"{source} ignored: {target} is set")
        return
    _set(raw, target, value)
    notes.append(f"{source} -> {target}")


def _get(data: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _pop(data: dict[str, Any], path: str) -> Any:
    *parents, last = path.split(".")
    for key in parents:
        data = data.get(key)  # type: ignore[assignment]
        if not isinstance(data, dict):
            return None
    return data.pop(last, None)


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        child = data.get(key)
        if not isinstance(child, dict):
            child = data[key] = {}
        data = child
    data[last] = value
