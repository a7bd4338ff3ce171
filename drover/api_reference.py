"""The REST API's reference page, made from the services' own OpenAPI documents (what
each serves at `/openapi.json`): every route of the coordinator, a buffer process and a
collector or learner, and every message they take or answer with its fields and
bounds. The documentation site makes it at each build (drover/docs_site.py), so it
cannot fall behind the routes.

    python -m drover.api_reference > rest-api.md
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask

from common.openapi import openapi_document


def _services() -> list[tuple[str, str, Callable[[], list[Blueprint]]]]:
    """Each service: its title, what it is, and its routes."""
    from services.buffer.app import routes as buffer_routes
    from services.coordinator.app import routes as coordinator_routes
    from services.slave.app import routes as slave_routes

    return [
        (
            "drover coordinator",
            "Users, operators and workers: jobs, experiments, workers and their tasks, "
            "policies, and the data routes an operator's tool may send through it (it "
            "passes them on to the job's buffer process).",
            coordinator_routes,
        ),
        (
            "drover buffer",
            "A job's buffer process: the data routes a collector's or learner's task "
            "sends to with its task's credential, and the coordinator's own routes "
            "(`/v1/shard/...`).",
            buffer_routes,
        ),
        (
            "drover collector or learner",
            "A worker's own routes, which the coordinator calls: a task to run, a task "
            "to cancel, its health and metrics.",
            slave_routes,
        ),
    ]


def document(title: str, routes: Callable[[], list[Blueprint]]) -> dict[str, Any]:
    """The OpenAPI document of a service whose routes are `routes()`: what it serves
    at `/openapi.json` (an app of those routes alone: nothing is started)."""
    app = Flask(title)
    for bp in routes():
        app.register_blueprint(bp)
    return openapi_document(app, title)


def markdown() -> str:
    """The whole page."""
    lines = [
        "# REST API",
        "",
        "Made from the services' own OpenAPI documents (each serves its own at "
        "`/openapi.json`; `drover/api_reference.py`). A route marked (auth) takes "
        "`Authorization: Bearer <secret>`: the cluster token, a worker's credential, or "
        "a task's data credential, as docs/operator.md's security section says. Every "
        "error is an `Error` body whose `message` says what to fix, naming the field.",
        "",
    ]
    schemas: dict[str, Any] = {}
    for title, about, routes in _services():
        doc = document(title, routes)
        schemas |= doc["components"]["schemas"]
        lines += [f"## {title.removeprefix('drover ').capitalize()}", "", about, ""]
        lines += ["| route | what it does | body | answer |", "|---|---|---|---|"]
        for path, methods in doc["paths"].items():
            for method, operation in methods.items():
                lock = " (auth)" if operation.get("security") else ""
                lines.append(
                    f"| `{method.upper()} {path}`{lock} | {_cell(operation['summary'])} | "
                    f"{_body(operation)} | {_answer(operation)} |"
                )
        lines.append("")
    lines += ["## Messages", ""]
    for name in sorted(schemas):
        lines += _message(name, schemas[name])
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _body(operation: dict[str, Any]) -> str:
    body = operation.get("requestBody")
    if body is None:
        return "-"
    kinds = [
        f"{_type(content['schema'])} ({_media(media)})"
        for media, content in body["content"].items()
    ]
    return "; ".join(kinds) + f", {body['description']}"


def _answer(operation: dict[str, Any]) -> str:
    said = []
    for status, answer in operation["responses"].items():
        if status == "default":
            continue
        content = answer.get("content", {})
        if content:
            kinds = ", ".join(
                f"{_type(c['schema'])} ({_media(media)})" for media, c in content.items()
            )
            said.append(f"{status}: {kinds}")
        else:
            said.append(f"{status}: {_cell(answer['description'])}")
    return "; ".join(said)


def _media(media: str) -> str:
    return {"application/json": "JSON"}.get(media, media)


def _type(schema: dict[str, Any]) -> str:
    """A schema as a short type: a message's name links to its section."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type(schema['additionalProperties'])}"
    if kind == "string" and schema.get("format") == "binary":
        return "bytes"
    return str(kind)


_BOUNDS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minItems": "at least {} items",
    "maxItems": "at most {} items",
    "pattern": "matches `{}`",
}


def _bounds(schema: dict[str, Any]) -> str:
    found = [form.format(schema[key]) for key, form in _BOUNDS.items() if key in schema]
    for option in schema.get("anyOf", []):
        found += [form.format(option[key]) for key, form in _BOUNDS.items() if key in option]
    return ", ".join(found)


def _message(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        return [*lines, f"Type: {_type(schema)}.", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | bounds | default |", "|---|---|---|---|---|"]
    for field, spec in properties.items():
        default = f"`{spec['default']}`" if "default" in spec else ""
        lines.append(
            f"| `{field}` | {_type(spec)} | {'yes' if field in required else ''} | "
            f"{_cell(_bounds(spec))} | {_cell(default)} |"
        )
    return [*lines, ""]


if __name__ == "__main__":
    print(markdown(), end="")
