"""The documents name files that exist: every repository path in README.md and
docs/ (in `code spans`, in fenced blocks when it names a file, and as a markdown
link's target) is there, and every link to a heading of a document finds it. URLs,
placeholders (`<job_id>`, `*`, `{a,b}`) and paths outside the repository's own
folders (a run folder, a TensorBoard tag) are not paths to check."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: The repository's own top-level names: a path starting with one of them is checked.
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
TOP -= {"runs", "build", "site"}
#: A path in a fenced block is checked when it names a file (a command's `deploy/...`
#: may be a Kubernetes object, not a folder).
FILE_SUFFIX = re.compile(r"\.(py|ya?ml|md|sh|json|png|toml|txt|js|html|css)$|Dockerfile$")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TOKEN = re.compile(r"[A-Za-z0-9_.\-/]+")


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for the document's headings."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def repository_path(token: str) -> str | None:
    """`token` as a path inside the repository, or None when it is not one to check."""
    token = token.strip().rstrip(".,;:)")
    if not token or "://" in token or PLACEHOLDER.search(token) or token.startswith("/"):
        return None
    first = token.split("/", 1)[0]
    if first not in TOP or (first == token and "." not in token and first != "Makefile"):
        return None
    return token


def mentioned_paths(text: str) -> set[str]:
    """Repository paths in the document: every one in a code span, and those that name
    a file in fenced blocks and in the prose."""
    paths = set()
    prose = FENCE.sub("", text)
    for span in CODE_SPAN.finditer(prose):
        for token in span.group(2).split():
            path = repository_path(token)
            if path:
                paths.add(path)
    rest = LINK.sub("", CODE_SPAN.sub("", prose))  # links are checked as links
    for part in (*(b.group(0) for b in FENCE.finditer(text)), rest):
        for token in TOKEN.findall(part):
            path = repository_path(token)
            if path and "/" in path and FILE_SUFFIX.search(path):
                paths.add(path)
    return paths


def links(text: str) -> set[str]:
    """Markdown link targets in the document (outside fenced blocks)."""
    return set(LINK.findall(FENCE.sub("", text)))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_document_names_exists(doc):
    missing = sorted(p for p in mentioned_paths(doc.read_text()) if not (ROOT / p).exists())
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_of_a_document_finds_its_file_and_heading(doc):
    broken = []
    for target in sorted(links(doc.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if file == ROOT / "docs" / "index.md":
            file = ROOT / "README.md"  # the site's home page is the README (drover/docs_site.py)
        if file == ROOT / "docs" / "rest-api.md":
            continue  # made at each site build (drover/docs_site.py), which checks it
        if not file.exists() or ROOT not in (file, *file.parents):
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
            broken.append(f"{target} (no such heading in {file.relative_to(ROOT)})")
    assert broken == [], f"{doc.relative_to(ROOT)} has broken links: {broken}"


def test_the_checks_find_what_they_look_for():
    text = (
        "See `common/envs.py` and `services/<name>/` and `loss/td`, and docs/config.md.\n"
        "[ops](docs/operator.md#metrics) ![x](docs/returns.png) [w](https://example.com)\n"
        "```console\n$ drover run examples/cartpole_dqn.yaml\n"
        "$ kubectl exec deploy/coordinator -- ls\n```\n"
    )
    assert mentioned_paths(text) == {
        "common/envs.py",
        "docs/config.md",
        "examples/cartpole_dqn.yaml",
    }
    assert links(text) == {"docs/operator.md#metrics", "docs/returns.png", "https://example.com"}
    assert "looking-at-a-running-cluster-drover-jobs-status" in heading_anchors(
        "## Looking at a running cluster: `drover jobs`, `status`\n"
    )
