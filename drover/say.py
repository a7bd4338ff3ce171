"""What the CLI says on stderr: one console for every verb, and the one error line.

soft_wrap: an error or summary line stays one line (greppable), whatever the width."""

from __future__ import annotations

import argparse
import webbrowser
from typing import Any

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)


def add_open(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--open", action="store_true", help="open the dashboard in a browser (signed in)"
    )


def show_dashboard(cluster: Any, open_browser: bool) -> None:
    """Say where a local cluster's dashboard is, signed in; open it with `--open`."""
    url = cluster.dashboard_url
    console.print(f"drover: dashboard {url}", highlight=False, markup=False)
    if open_browser and not webbrowser.open(url):
        console.print("drover: no browser to open here; open the line above", highlight=False)


def error(message: str, status: int = 2) -> int:
    """Print `drover: error: <message>`; returns `status`, the exit status to give."""
    console.print(f"[bold red]drover: error:[/] {message}", highlight=False)
    return status
