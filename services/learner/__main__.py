"""`python -m services.learner`: serve a learner until SIGTERM.

Under torchrun with two or more ranks (`torchrun --nproc-per-node N -m
services.learner`), each process is one rank of a learner group instead
(services/learner/aggregator.py).
"""

import sys

from services.learner.group import RankEnv
from services.learner.settings import DEFAULT_PORT

if __name__ == "__main__":
    from algorithms.step import warm_up_soon

    warm_up_soon()  # torch.optim's lazy imports, while the learner starts and registers
    ranks = RankEnv.from_env()
    if ranks is not None:
        from services.learner.aggregator import run_rank

        sys.exit(run_rank(ranks, DEFAULT_PORT))
    from services.learner.app import create_app
    from services.learner.feeder import start_spare
    from services.slave.main import run_slave

    start_spare()  # for the first learn task (`learn.feed: process`, the default)
    sys.exit(run_slave("learner", DEFAULT_PORT, create_app))
