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
    logging.getLogger("urllib3.connectionpool").addFilter(RetriesAsDebug())


class RetriesAsDebug(logging.Filter):
    """urllib3 warns at each retry of a connection it will try again; the caller logs
    what matters (the error it gives up on), and a retry that then succeeds, as when
    services start together and one is not listening yet, is routine: such records are
    kept at debug level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not record.getMessage().startswith("Retrying"):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)
