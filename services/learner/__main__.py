"""`python -m services.learner`: serve a learner until SIGTERM."""

import sys

from services.learner.app import create_app
from services.learner.settings import DEFAULT_PORT
from services.slave.main import run_slave

if __name__ == "__main__":
    sys.exit(run_slave("learner", DEFAULT_PORT, create_app))
