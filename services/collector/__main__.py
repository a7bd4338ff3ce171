"""`python -m services.collector`: serve a collector until SIGTERM."""

import sys

from common.slave_main import run_slave
from services.collector.app import create_app
from services.collector.settings import DEFAULT_PORT

if __name__ == "__main__":
    sys.exit(run_slave("collector", DEFAULT_PORT, create_app))
