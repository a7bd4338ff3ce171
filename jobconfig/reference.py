"""The config reference (docs/config.md), generated from the config classes, so it
cannot drift from them: every key of the sections every job has, then each
algorithm's own keys and the defaults it changes.

    python -m jobconfig.reference > docs/config.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types

from algorithms.registry import ALGORITHMS
from common.config import JobConfig, PolicyConfig
from jobconfig.resolve import section_type

#: The bound each constraint type means, rendered.
_BOUNDS = {
    annotated_types.Gt: "> {}",
    annotated_types.Ge: ">= {}",
    annotated_types.Lt: "< {}",
    annotated_types.Le: "<= {}",
    annotated_types.MinLen: "at least {} long",
    annotated_types.MaxLen: "at most {} long",
}


def field_docs(cls: type) -> dict[str, str]:
    """Each field's `#:` comment in the class's source (joined lines)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        lines = source.splitlines()
        previous: ast.AnnAssign | None = None
        for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                comment: list[str] = []
                i = node.lineno - 2
                while i >= 0 and lines[i].strip().startswith("#:"):
                    comment.insert(0, lines[i].strip()[2:].strip())
                    i -= 1
                if comment:
                    docs[node.target.id] = " ".join(comment)
                elif previous is not None and previous.end_lineno == node.lineno - 1:
                    # A comment above a run of fields (no blank line) speaks for each.
                    name = previous.target.id  # type: ignore[union-attr]
                    if name in docs:
                        docs[node.target.id] = docs[name]
                previous = node
            else:
                previous = None
    return docs


def _type_text(hint: Any) -> str:
    """A field's type as a reader wants it: the values it takes, with bounds."""
    bounds: list[str] = []
    if typing.get_origin(hint) is typing.Annotated:
        hint, *meta = typing.get_args(hint)
        for item in meta:
            for kind, text in _BOUNDS.items():
                if isinstance(item, kind):
                    value = next(iter(dataclasses.asdict(item).values()))
                    bounds.append(text.format(value))
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_text(arg) for arg in typing.get_args(hint)]
        text = " or ".join("null" if p == "NoneType" else p for p in parts)
    elif origin is typing.Literal:
        text = " or ".join(f"`{v}`" for v in typing.get_args(hint))
    elif origin is list:
        text = f"list of {_type_text(typing.get_args(hint)[0])}"
    elif origin is dict:
        text = "mapping"
    else:
        text = getattr(hint, "__name__", str(hint))
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _default_text(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = field.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return ""
    else:
        return "required"
    return (
        "null" if value is None else f"`{value}`".replace("True", "true").replace("False", "false")
    )


def rows(cls: type, prefix: str = "", skip: frozenset[str] = frozenset()) -> Iterator[tuple]:
    """(key, default, type, meaning) of every leaf key of a section class."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        sub = section_type(hints[field.name])
        path = f"{prefix}{field.name}"
        if sub is not None:
            yield from rows(sub, f"{path}.")
            continue
        yield path, _default_text(field), _type_text(hints[field.name]), docs.get(field.name, "")


def own_rows(cls: type[PolicyConfig]) -> list[tuple]:
    """The keys an algorithm's config class has that the shared sections do not."""
    shared = {row[0] for row in rows(PolicyConfig, "policy.")}
    return [row for row in rows(cls, "policy.") if row[0] not in shared]


def _table(items: list[tuple]) -> list[str]:
    out = ["| key | default | values | meaning |", "|---|---|---|---|"]
    out += [f"| `{k}` | {d} | {t} | {m} |" for k, d, t, m in items]
    return out


def _flat(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def reference() -> str:
    """docs/config.md's text."""
    lines = [
        "# Config reference",
        "",
        "Generated from the config classes by `python -m jobconfig.reference`",
        "(`tests/unit/test_config_reference.py` fails when this file is out of date).",
        "A job config is these keys, nested (`policy.learn.batch_size` is",
        "`policy: {learn: {batch_size: ...}}`), merged over the algorithm's defaults.",
        "",
        "## Every job",
        "",
    ]
    shared = [r for r in rows(JobConfig, skip=frozenset({"policy"}))]
    shared += list(rows(PolicyConfig, "policy."))
    lines += _table(sorted(shared, key=lambda r: _order(r[0])))
    for name, spec in sorted(ALGORITHMS.items()):
        lines += ["", f"## `policy.type: {name}`", ""]
        own = own_rows(spec.config)
        if own:
            lines += ["Its own keys:", "", *_table(own), ""]
        changed = list(_flat(dict(spec.defaults)))
        if changed:
            lines += ["Defaults it changes:", ""]
            lines += [f"- `{k}`: `{v}`" for k, v in changed]
        if not own and not changed:
            lines += ["The keys every job has, with their defaults."]
    return "\n".join(lines).rstrip() + "\n"


def _order(key: str) -> tuple[int, str]:
    top = ("exp_name", "strict", "env", "policy", "system")
    head = key.split(".")[0]
    return (top.index(head) if head in top else len(top), key)


if __name__ == "__main__":
    print(reference(), end="")
