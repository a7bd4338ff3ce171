"""What one call to a drover service costs the caller: `ServiceClient` against the same
call made with `requests` (what drover's client was built on before) and with bare
urllib3 (no retries, no error mapping: the floor).

    python bench/service_client.py [--calls 1000] [--repeats 3]

A Flask app served by waitress (as every drover service is, `common.http_server`)
runs in a subprocess, so the caller's CPU time (`time.process_time`) is the client's
alone. Two calls, each timed over `--calls` round trips after 200 warm-up ones, in
alternating order, the fastest of 3 repeats (and what the server process spent on
each call meanwhile: the floor of a route's cost in a drover service):

- `GET small`: a status poll (a heartbeat, a job's status): a few bytes each way;
- `POST sample`: a learner feeder's sample request, 512 priorities out, 64 item
  references back (about 9 KB and 3 KB).

Every client keeps its connection alive and sends the same headers a drover call does
(the bearer token, JSON). The ratio column is the client's CPU per call over bare
urllib3's. A collector's uploader and heartbeats, a learner's feeder and every CLI
verb go through `ServiceClient`; the feeder makes about one sample request per 8
training iterations, so at 1,000 iterations/s each 100 us saved is a hundredth of a
core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import urllib3
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learner_scaling import cpu_line  # noqa: E402
from bench.procfs import cpu_s  # noqa: E402
from common.http_client import ServiceClient  # noqa: E402
from drover.local import free_port  # noqa: E402

SERVER = """
import sys
from flask import Flask, request
sys.path.insert(0, sys.argv[2])
from common.http_server import ServerLimits, serve
app = Flask("echo")
ITEMS = b",".join(b'{"key": %d, "path": "j/w.t/000042.seg", "row": 3}' % i for i in range(64))
@app.post("/sample")
def sample():
    request.get_data()
    return b'{"items": [' + ITEMS + b']}', 200, {"Content-Type": "application/json"}
@app.get("/status")
def status():
    return b'{"ok": true}', 200, {"Content-Type": "application/json"}
serve(app, "127.0.0.1", int(sys.argv[1]), limits=ServerLimits(), on_stop=lambda: None)
"""
TOKEN = "bench-token"
PRIORITIES = {"batch_size": 64, "priorities": [0.5] * 512, "keys": list(range(512))}


def clients(url: str) -> dict[str, dict[str, Callable[[], object]]]:
    """Each client's two calls, each returning the decoded answer."""
    drover = ServiceClient(url, TOKEN, timeout_s=10.0)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    pool = urllib3.PoolManager()
    timeout = urllib3.Timeout(connect=10.0, read=10.0)

    def bare(method: str, path: str, payload: object = None) -> object:
        body = json.dumps(payload).encode() if payload is not None else None
        resp = pool.request(method, url + path, body=body, headers=headers, timeout=timeout)
        return json.loads(resp.data)

    made: dict[str, dict[str, Callable[[], object]]] = {
        "ServiceClient": {
            "GET small": lambda: drover.call("GET", "/status"),
            "POST sample": lambda: drover.call("POST", "/sample", PRIORITIES),
        },
        "urllib3, bare": {
            "GET small": lambda: bare("GET", "/status"),
            "POST sample": lambda: bare("POST", "/sample", PRIORITIES),
        },
    }
    try:
        import requests
    except ImportError:
        print("requests is not installed: its rows are left out (pip install requests)")
        return made
    session = requests.Session()
    made["requests.Session"] = {
        "GET small": lambda: session.get(url + "/status", headers=headers, timeout=10.0).json(),
        "POST sample": lambda: session.post(
            url + "/sample", json=PRIORITIES, headers=headers, timeout=10.0
        ).json(),
    }
    return made


def timed(call: Callable[[], object], calls: int, server: int) -> tuple[float, float, float]:
    """(wall us, client CPU us, server CPU us) per call; `server` is the server's pid."""
    for _ in range(200):
        call()
    wall, cpu, served = time.perf_counter(), time.process_time(), cpu_s(server)
    for _ in range(calls):
        call()
    return (
        1e6 * (time.perf_counter() - wall) / calls,
        1e6 * (time.process_time() - cpu) / calls,
        1e6 * (cpu_s(server) - served) / calls,
    )


def wait_until_up(call: Callable[[], object], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(ROOT)])
    try:
        made = clients(f"http://127.0.0.1:{port}")
        wait_until_up(made["urllib3, bare"]["GET small"])
        best: dict[tuple[str, str], tuple[float, float, float]] = {}
        for _ in range(args.repeats):
            for name, calls in made.items():
                for what, call in calls.items():
                    got = timed(call, args.calls, server.pid)
                    if (name, what) not in best or got[1] < best[name, what][1]:
                        best[name, what] = got
    finally:
        server.terminate()
        server.wait(timeout=10)
    table = Table(title=f"One call to a local drover-style service; {cpu_line()}")
    for column in (
        "call",
        "client",
        "wall us",
        "client CPU us",
        "CPU / bare urllib3",
        "server CPU us",
    ):
        table.add_column(column, justify="right")
    for what in ("GET small", "POST sample"):
        floor = best["urllib3, bare", what][1]
        for name in made:
            wall_us, cpu_us, server_us = best[name, what]
            table.add_row(
                what,
                name,
                f"{wall_us:,.0f}",
                f"{cpu_us:,.0f}",
                f"{cpu_us / floor:.2f}",
                f"{server_us:,.0f}",
            )
    Console(width=130).print(table)
    print(
        f"The fastest of {args.repeats} repeats of {args.calls} calls each, by client CPU. "
        "Server CPU: what the waitress + Flask process spent a call meanwhile (its "
        "utime + stime), the floor under any route of a drover service, which does its "
        "own work on top."
    )


if __name__ == "__main__":
    main()
