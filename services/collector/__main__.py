"""`python -m services.collector`: serve a collector until SIGTERM."""

import sys

from common.env_guard import setup_env_registry
from common.settings import SettingsError
from services.collector.app import create_app
from services.collector.settings import DEFAULT_PORT
from services.slave.main import run_slave


def main() -> int:
    # The operator's env packages register their envs before any task can name one.
    try:
        setup_env_registry()
    except SettingsError as exc:
        print(f"drover collector: {exc}", file=sys.stderr)
        return 2
    return run_slave("collector", DEFAULT_PORT, create_app)


if __name__ == "__main__":
    sys.exit(main())
