"""The `drover` command's entry (the `drover` script, and `python -m drover`).

`drover run` starts its fork server (drover/forkserver.py) here, before the command's
own imports (a third of a second of CPU: rich, yaml, the config models): the server's
preload of torch is what the first learner and collectors wait for, so it starts
first, and the imports below overlap it. Everything else is drover/cli.py.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def wants_fork_server(argv: list[str]) -> bool:
    """Whether the command is a local `drover run` that will start services (not a
    run through Docker, nor a request for help)."""
    if argv[:1] != ["run"]:
        return False
    rest = argv[1:]
    asks_help = any(arg in ("-h", "--help") for arg in rest)
    docker = "--backend=docker" in rest or any(
        a == "--backend" and b == "docker" for a, b in zip(rest, rest[1:], strict=False)
    )
    return not asks_help and not docker


def console_main() -> NoReturn:
    from common.process import stop_on_terminate

    stop_on_terminate()  # before the fork server starts: it is stopped on SIGTERM too
    early = None
    if wants_fork_server(sys.argv[1:]):
        from drover.forkserver import ForkServer

        early = ForkServer.early()
    try:
        from drover import cli

        cli.console_main(early)
    except BaseException:  # an import that failed, Ctrl-C during it: no server waits on
        if early is not None:
            early.discard()
        raise


if __name__ == "__main__":
    console_main()
