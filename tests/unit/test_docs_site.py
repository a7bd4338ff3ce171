"""The documentation site builds with `mkdocs build --strict`: a broken link, a link to
a heading that is not there, a page left out of the nav or a reference to a name the
code does not have fails it. Its home page is the README and its REST API page is the
services' OpenAPI documents (drover/docs_site.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.processes  # mkdocs in a process of its own, about 7 s: not in `make test-fast`
@pytest.mark.timeout(300)
def test_the_docs_site_builds_strictly(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-4000:]
    home = (tmp_path / "index.html").read_text()
    assert "make run" in home and 'href="guide/"' in home  # the README, its links the site's
    api = (tmp_path / "rest-api" / "index.html").read_text()
    assert "/api/v1/jobs/{job_id}/segments" in api and "SegmentInsert" in api
    client = (tmp_path / "reference" / "client" / "index.html").read_text()
    assert "download" in client and "wait" in client


def test_the_rest_api_page_has_every_route_each_service_serves():
    from drover.api_reference import _services, document, markdown

    page = markdown()
    for title, _, routes in _services():
        for path, methods in document(title, routes)["paths"].items():
            for method in methods:
                assert f"`{method.upper()} {path}`" in page, (title, method, path)
