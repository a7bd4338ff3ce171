"""What the sections an experiment adds to a job's config (`sweep:`, `tune:`, `pbt:`)
check alike: the section split off the config, its keys, its whole numbers, and the
value of a dotted key in a config."""

from __future__ import annotations

from typing import Any

from common.config import ConfigError


def split_section(raw: dict[str, Any], name: str) -> tuple[dict[str, Any], Any]:
    """(the config without its section `name` (`sweep`, `tune`), the section or None)."""
    return {k: v for k, v in raw.items() if k != name}, raw.get(name)


def value_at(config: dict[str, Any], key: str) -> Any:
    """The value of a dotted key in a config dict (None where it has none)."""
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_keys(section: dict[str, Any], known: set[str], name: str) -> None:
    """Refuse a key of the section `name` that is not one of `known`."""
    for key in section:
        if key not in known:
            keys = ", ".join(sorted(known))
            raise ConfigError(f"{name}.{key}", f"unknown key (the keys: {keys})")


def whole_number(
    section: dict[str, Any],
    name: str,
    key: str,
    default: int,
    *,
    low: int = 1,
    high: int | None = None,
) -> int:
    """The integer `key` of the section `name`, from `low` (to `high`)."""
    value = section.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"of at least {low}" if high is None else f"from {low} to {high}"
        raise ConfigError(f"{name}.{key}", f"an integer {bounds}")
    return value
