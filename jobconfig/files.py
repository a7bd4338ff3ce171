"""Config files: YAML, JSON, or DI-engine's Python files (`main_config` and
`create_config`, translated by `jobconfig.di_engine`).

A YAML or JSON file may build on another: `base: PATH` (relative to the file) is read
first and the file's own keys are merged over it, so a sweep or a variant names only
what it changes:

    base: ../cartpole_dqn.yaml
    policy: {learn: {learning_rate: 0.001}}
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import yaml

from common.config import ConfigError, deep_merge
from jobconfig.di_engine import from_di_engine


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML, JSON or Python config file into a plain dict (`load_config`
    without its notes)."""
    return load_config(path)[0]


def load_config(
    path: str | Path, *, allow_unknown_keys: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """Read a YAML, JSON or Python config file into a plain dict, and a note for each
    DI-engine key it translated.

    A Python file is DI-engine's shape: `main_config`, and `create_config` naming the
    algorithm and the env (common/di_engine.py maps both, or refuses them). Python
    configs run code, so only the local CLI reads them; the REST API takes data.

    An unknown key in a job's config is an error (a typo is not a default), except in
    a Python file, which carries many keys drover has no use for (jobconfig/di_engine.py
    makes it `strict: false` unless it says otherwise: each is a warning), and with
    `allow_unknown_keys`.
    """
    raw, notes = _load(Path(path))
    if allow_unknown_keys:
        raw["strict"] = False
    return raw, notes


def _load(path: Path) -> tuple[dict[str, Any], list[str]]:
    create: Any = None
    if not path.is_file():
        raise ConfigError("config", f"no such file: {path}")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        data = yaml.safe_load(path.read_text())
    elif suffix == ".json":
        data = json.loads(path.read_text())
    elif suffix == ".py":
        names = runpy.run_path(str(path), run_name="drover_config")
        data, create = names.get("main_config"), names.get("create_config")
        if data is None:
            raise ConfigError("config", f"{path} defines no main_config")
    else:
        raise ConfigError("config", f"{path}: use .yaml, .yml, .json or .py")
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} does not hold a mapping")
    if create is not None and not isinstance(create, dict):
        raise ConfigError("create_config", f"{path}: create_config is not a mapping")
    if suffix != ".py":
        return _with_base(plain(data), path, seen=(path.resolve(),))
    return from_di_engine(plain(data), plain(create) if create is not None else None)


#: Files a chain of `base:` may go through.
MAX_BASES = 8


def _with_base(
    data: dict[str, Any], path: Path, seen: tuple[Path, ...]
) -> tuple[dict[str, Any], list[str]]:
    """`data` merged over its `base:` file (and that one's, in turn)."""
    if "base" not in data:
        return data, []
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError("base", f"{path}: base names a config file, relative to this one")
    base_path = (path.parent / base).resolve()
    if base_path in seen or len(seen) >= MAX_BASES:
        raise ConfigError("base", f"{path}: base files go round in a circle or too deep")
    if base_path.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError("base", f"{path}: a base is a .yaml, .yml or .json file")
    if not base_path.is_file():
        raise ConfigError("base", f"{path}: no such file: {base_path}")
    text = base_path.read_text()
    below = json.loads(text) if base_path.suffix.lower() == ".json" else yaml.safe_load(text)
    if not isinstance(below, dict):
        raise ConfigError("base", f"{base_path} does not hold a mapping")
    below, notes = _with_base(plain(below), base_path, (*seen, base_path))
    return deep_merge(below, data), notes


def plain(value: Any) -> Any:
    """Plain dicts and lists of JSON-like data (a Python config's tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
