"""The OpenAPI document, made to say exactly what this app (with its settings) accepts and answers.

FastAPI derives the schema from the pydantic models, which cannot know the settings-dependent
limits or that exactly one of `query` / `queries` is needed. Clients and the schemathesis fuzz
test read the document, so it states them: maxLength, maximum, maxItems, a non-blank pattern,
the oneOf, the 400/413 of a body that cannot be read, and the bearer scheme with its 401/403
when API keys are configured.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from service.http.auth import is_open
from service.settings import ServiceSettings

# A character str.isspace() is False for (spelled out, so every regex engine reads it the same way).
NOT_BLANK = "[^\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
_BODY_ERRORS = {
    "400": {"description": "The body could not be read (e.g. not UTF-8).", **_ERROR},
    "413": {"description": "The body is over TANDEM_MAX_BODY_BYTES.", **_ERROR},
}
_AUTH_ERRORS = {
    "401": {"description": "No API key: send `Authorization: Bearer <key>`.", **_ERROR},
    "403": {"description": "The API key is not valid.", **_ERROR},
}
SCHEME = "apiKey"


def install_openapi(app: FastAPI, settings: ServiceSettings, keys_required: bool) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # caches itself on app.openapi_schema
            refine(schema, settings, keys_required)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def _non_null(prop: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of pydantic's `anyOf: [X, {type: null}]` for an optional field."""
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    return branches[0]


def refine(schema: dict[str, Any], settings: ServiceSettings, keys_required: bool) -> None:
    request = schema.get("components", {}).get("schemas", {}).get("SearchRequest")
    if request is not None:
        props = request["properties"]
        query = _non_null(props["query"])
        query.update(maxLength=settings.max_query_chars, pattern=NOT_BLANK)
        queries = _non_null(props["queries"])
        queries["maxItems"] = settings.max_batch_queries
        queries["items"].update(maxLength=settings.max_query_chars, pattern=NOT_BLANK)
        _non_null(props["top_k"])["maximum"] = settings.max_top_k
        request["oneOf"] = [  # exactly one of them, and not null
            {"required": ["query"], "properties": {"query": {"type": "string"}}},
            {"required": ["queries"], "properties": {"queries": {"type": "array"}}},
        ]
    _refine_embeddings(schema, settings.max_query_chars, settings.max_batch_queries, NOT_BLANK)
    if keys_required:
        schema.setdefault("components", {}).setdefault("securitySchemes", {})[SCHEME] = {
            "type": "http", "scheme": "bearer", "description": "One of the keys in TANDEM_API_KEYS(_FILE).",
        }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            if "requestBody" in operation:
                for status, response in _BODY_ERRORS.items():
                    responses.setdefault(status, response)
            if keys_required and not is_open(path):
                operation["security"] = [{SCHEME: []}]
                for status, response in _AUTH_ERRORS.items():
                    responses.setdefault(status, response)


def _refine_embeddings(schema: dict[str, Any], max_chars: int, max_items: int, not_blank: str) -> None:
    """The same limits for POST /v1/embeddings, whose `input` is one text or a list of them."""
    request = schema.get("components", {}).get("schemas", {}).get("EmbeddingsRequest")
    if request is None:
        return
    for branch in request["properties"]["input"].get("anyOf", []):
        if branch.get("type") == "string":
            branch.update(maxLength=max_chars, pattern=not_blank)
        elif branch.get("type") == "array":
            branch["maxItems"] = max_items
            branch["items"].update(maxLength=max_chars, pattern=not_blank)
