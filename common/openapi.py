"""OpenAPI documents generated from the routes and the message dataclasses they use.

Each view declares what it takes and gives with `@documented(body=..., reply=...)`;
`openapi_document(app)` walks the app's URL map and turns those declarations into an
OpenAPI 3.1 document whose schemas come from the same dataclasses the code validates
with (pydantic's JSON Schema of them), so the document cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask
from pydantic import TypeAdapter

from common.array_bodies import CONTENT_TYPE as ARRAYS_TYPE
from common.array_bodies import ArrayField, describe
from common.http import PUBLIC_PATHS
from common.messages import BodyLimit

F = TypeVar("F", bound=Callable[..., Any])
REF = "#/components/schemas/{model}"

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. invalid, not_found"},
        "message": {"type": "string", "description": "what to fix"},
        "retry_after_s": {"type": "number"},
    },
}


def documented(
    *,
    summary: str,
    body: type | None = None,
    reply: type | None = None,
    status: int = 200,
    content_type: str = "application/json",
    query: dict[str, dict[str, Any]] | None = None,
    no_content: str | None = None,
    body_arrays: dict[str, ArrayField] | None = None,
    reply_arrays: dict[str, ArrayField] | None = None,
) -> Callable[[F], F]:
    """Declare a view's request body and answer for the OpenAPI document.

    `body` must declare its `body_limit` (common/messages.py: BodyLimit), the most a
    request may send; the document states it. `no_content`: when the view may also
    answer 204 with no body, what that means. `body_arrays`, `reply_arrays`: the
    view also takes, or answers with, a binary frame (common/array_bodies.py) carrying
    these fields as arrays.
    """
    if body is not None and not isinstance(getattr(body, "body_limit", None), BodyLimit):
        raise TypeError(f"{body.__name__} declares no body_limit: how large may its body be?")

    def mark(view: F) -> F:
        view.__openapi__ = {  # type: ignore[attr-defined]
            "summary": summary,
            "body": body,
            "reply": reply,
            "status": status,
            "content_type": content_type,
            "query": query or {},
            "no_content": no_content,
            "body_arrays": body_arrays,
            "reply_arrays": reply_arrays,
        }
        return view

    return mark


def _schema(cls: type, components: dict[str, Any], mode: str) -> dict[str, Any]:
    schema = TypeAdapter(cls).json_schema(ref_template=REF, mode=mode)  # type: ignore[arg-type]
    components.update(schema.pop("$defs", {}))
    name = getattr(cls, "__name__", "Body")
    components[name] = schema
    return {"$ref": REF.format(model=name)}


def _frame(fields: dict[str, ArrayField]) -> dict[str, Any]:
    return {"schema": {"type": "string", "format": "binary", "description": describe(fields)}}


def openapi_document(app: Flask, title: str, version: str = "1") -> dict[str, Any]:
    components: dict[str, Any] = {"Error": ERROR_SCHEMA}
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions.get(rule.endpoint)
        doc = getattr(view, "__openapi__", None)
        if doc is None:
            continue
        path = rule.rule.replace("<", "{").replace(">", "}")
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            operation: dict[str, Any] = {
                "summary": doc["summary"],
                "operationId": f"{rule.endpoint}.{method.lower()}",
                "parameters": [
                    {"name": arg, "in": "path", "required": True, "schema": {"type": "string"}}
                    for arg in sorted(rule.arguments)
                ]
                + [
                    {"name": name, "in": "query", "required": False, "schema": schema}
                    for name, schema in doc["query"].items()
                ],
                "responses": {
                    "default": {
                        "description": "an error: what to fix is in `message`",
                        "content": {
                            "application/json": {"schema": {"$ref": REF.format(model="Error")}}
                        },
                    }
                },
            }
            if doc["body"] is not None:
                limit = doc["body"].body_limit
                operation["requestBody"] = {
                    "description": f"at most {limit.max_bytes} bytes (413 beyond)",
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": _schema(doc["body"], components, "validation")
                        }
                    },
                }
                if doc["body_arrays"]:
                    operation["requestBody"]["content"][ARRAYS_TYPE] = _frame(doc["body_arrays"])
            answer: dict[str, Any] = {"description": "success"}
            if doc["reply"] is not None:
                answer["content"] = {
                    doc["content_type"]: {
                        "schema": _schema(doc["reply"], components, "serialization")
                    }
                }
                if doc["reply_arrays"]:
                    answer["content"][ARRAYS_TYPE] = _frame(doc["reply_arrays"])
            elif doc["content_type"] != "application/json":
                answer["content"] = {doc["content_type"]: {"schema": {"type": "string"}}}
            operation["responses"][str(doc["status"])] = answer
            if doc["no_content"]:
                operation["responses"]["204"] = {"description": doc["no_content"]}
            if rule.rule not in PUBLIC_PATHS:
                operation["security"] = [{"bearer": []}]
            paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def install_openapi(app: Flask, title: str) -> None:
    """Serve the app's document at `/openapi.json` (public: it holds no secrets)."""

    @app.get("/openapi.json")
    def openapi() -> Any:
        return openapi_document(app, title)
