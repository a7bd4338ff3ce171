"""Config files: YAML, JSON, or DI-engine's Python files (`main_config` and
`create_config`, translated by `jobconfig.di_engine`)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import yaml

from common.config import ConfigError
from jobconfig.di_engine import from_di_engine


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML, JSON or Python config file into a plain dict (`load_config`
    without its notes)."""
    return load_config(path)[0]


def load_config(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """Read a YAML, JSON or Python config file into a plain dict, and a note for each
    DI-engine key it translated.

    A Python file is DI-engine's shape: `main_config`, and `create_config` naming the
    algorithm and the env (common/di_engine.py maps both, or refuses them). Python
    configs run code, so only the local CLI reads them; the REST API takes data.
    """
    path = Path(path)
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
        return plain(data), []
    return from_di_engine(plain(data), plain(create) if create is not None else None)


def plain(value: Any) -> Any:
    """Plain dicts and lists of JSON-like data (a Python config's tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
