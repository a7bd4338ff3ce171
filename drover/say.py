"""What the CLI says on stderr: one console for every verb, and the one error line.

soft_wrap: an error or summary line stays one line (greppable), whatever the width."""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)


def error(message: str, status: int = 2) -> int:
    """Print `drover: error: <message>`; returns `status`, the exit status to give."""
    console.print(f"[bold red]drover: error:[/] {message}", highlight=False)
    return status
