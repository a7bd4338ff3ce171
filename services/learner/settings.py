"""Learner settings, from `DROVER_*` environment variables (see SlaveSettings)."""

from __future__ import annotations

from collections.abc import Mapping

from common.settings import SlaveSettings

DEFAULT_PORT = 8200


def from_env(env: Mapping[str, str] | None = None) -> SlaveSettings:
    return SlaveSettings.from_env(DEFAULT_PORT, env)
