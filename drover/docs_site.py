"""The documentation site's build hooks (mkdocs.yml's `hooks:`; `make docs`): its home
page is the README, and its REST API page is made from the services' OpenAPI documents
(drover/api_reference.py), both at each build, so neither is a copy that can fall
behind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def home_page() -> str:
    """The README, its links into docs/ made the site's own."""
    return re.sub(r"\]\(docs/", "](", (ROOT / "README.md").read_text())


def on_files(files: Files, config: Any) -> Files:
    from drover.api_reference import markdown

    files.append(File.generated(config, "index.md", content=home_page()))
    files.append(File.generated(config, "rest-api.md", content=markdown()))
    return files
