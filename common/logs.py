"""One logging setup for every drover process."""

from __future__ import annotations

import logging
import os


def setup_logging(service: str) -> None:
    level = os.environ.get("DROVER_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
    # Access logs of every heartbeat would drown the useful lines.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
