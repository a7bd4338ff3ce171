"""`python -m services.learner`: serve a learner until SIGTERM."""

import sys

from common.slave_main import run_slave
from services.learner.app import create_app
from services.learner.settings import DEFAULT_PORT

if __name__ == "__main__":
    sys.exit(run_slave("learner", DEFAULT_PORT, create_app))
