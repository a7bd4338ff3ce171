"""The web dashboard: a static page (`/`) and its files (`/dashboard/<file>`).

The page holds no data, so these routes take no token: the page asks for the token
once and sends it with every `/api/v1` call it makes. They are not part of the API
and so not in the OpenAPI document.
"""

from pathlib import Path

from flask import Blueprint, Response, send_from_directory

from common.http import public

#: index.html, app.js, style.css: package data (pyproject.toml), no build step.
DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"

bp = Blueprint("dashboard", __name__)


@bp.get("/")
@public
def index() -> Response:
    return _send("index.html")


@bp.get("/dashboard/<path:filename>")
@public
def asset(filename: str) -> Response:
    # send_from_directory joins safely: `..`, absolute paths and the like are a 404.
    return _send(filename)


def _send(filename: str) -> Response:
    resp = send_from_directory(DASHBOARD_DIR, filename, max_age=0)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp
