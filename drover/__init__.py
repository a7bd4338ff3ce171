"""drover: distributed reinforcement learning. From Python: `from drover import Client`
(drover/client.py); the command line: `drover` (drover/cli.py)."""


def __getattr__(name: str):
    # The client is imported when asked for: `python -m drover` and the services
    # import this package too, and need none of it.
    if name in ("Client", "ApiError", "ServiceUnavailable"):
        from drover import client

        return getattr(client, name)
    raise AttributeError(f"module 'drover' has no attribute {name!r}")
