"""The OpenAPI 3.1 document, generated from the pydantic wire models.

The schemas come from the models themselves, so the document cannot drift
from what the handlers accept and return; the table below only says which
model goes with which endpoint, status and error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from sandboxd import __version__
from sandboxd.models import (
    ArchiveUploaded,
    CreateSandboxRequest,
    DaemonStatus,
    ExecRequest,
    ExecResult,
    FileList,
    FileUploaded,
    Problem,
    Sandbox,
    SandboxList,
    Version,
)

REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    summary: str
    status: int
    response: type[BaseModel] | str | None  # a model, a media type, or no body
    errors: tuple[int, ...]
    body: type[BaseModel] | str | None = None  # a model (JSON) or "multipart"
    query: tuple[tuple[str, str, str], ...] = ()  # (name, type, description)
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


_ID = ("id", "the sandbox id returned by create")
_PATH = ("path", "a path inside the workspace, relative to it")

OPERATIONS = (
    Op("post", "/v1/sandboxes", "Create a sandbox", 201, Sandbox, (400, 415, 422, 429, 503),
       body=CreateSandboxRequest, notes="An empty body means all defaults."),
    Op("get", "/v1/sandboxes", "List sandboxes", 200, SandboxList, ()),
    Op("get", "/v1/sandboxes/{id}", "Show one sandbox", 200, Sandbox, (404,)),
    Op("delete", "/v1/sandboxes/{id}", "Delete a sandbox and its workspace", 204, None, (404,)),
    Op("post", "/v1/sandboxes/{id}/files", "Upload one file", 201, FileUploaded,
       (400, 404, 409, 413, 415, 422), body="multipart",
       notes="Form field `file`; an optional `path` field, sent before it, names a subfolder."),
    Op("get", "/v1/sandboxes/{id}/files", "List the workspace", 200, FileList, (400, 404, 422),
       query=(("path", "string", "a folder inside the workspace (default: its root)"),
              ("recursive", "boolean", "list subfolders too"))),
    Op("get", "/v1/sandboxes/{id}/files/{path}", "Download one file", 200,
       "*/*", (400, 404, 422), notes="The Content-Type is guessed from the file name."),
    Op("delete", "/v1/sandboxes/{id}/files/{path}", "Delete a file or folder", 204, None,
       (400, 404, 422)),
    Op("get", "/v1/sandboxes/{id}/archive", "Download the workspace as a zip", 200,
       "application/zip", (404,)),
    Op("post", "/v1/sandboxes/{id}/upload", "Upload a project as a zip", 201, ArchiveUploaded,
       (400, 404, 409, 413, 415, 422), body="multipart",
       notes="Form field `file`: a zip made from inside the project folder."),
    Op("post", "/v1/sandboxes/{id}/exec", "Run a command (optionally then the tests)", 200,
       ExecResult, (400, 404, 410, 413, 415, 422, 429, 500, 503), body=ExecRequest,
       notes="With `Accept: text/event-stream` the answer is a stream of `stdout`, `stderr` "
       "and `phase` events ending in a `result` event carrying this body."),
    Op("get", "/v1/version", "The daemon's version", 200, Version, ()),
    Op("get", "/v1/status", "The daemon's state and limits", 200, DaemonStatus, ()),
    Op("get", "/v1/openapi.json", "This document", 200, "application/json", ()),
)  # fmt: skip

_MODELS: list[type[BaseModel]] = [
    CreateSandboxRequest, ExecRequest, Sandbox, SandboxList, FileList, FileUploaded,
    ArchiveUploaded, ExecResult, Problem, DaemonStatus, Version,
]  # fmt: skip


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _problem(status: int) -> dict[str, Any]:
    return {
        "description": "an RFC 9457 problem",
        "content": {"application/problem+json": {"schema": _ref(Problem)}},
    }


def _operation_id(op: Op) -> str:
    words = op.path.strip("/").replace("{", "").replace("}", "").replace(".", "_").split("/")
    return "_".join((op.method, *words))


def _operation(op: Op) -> dict[str, Any]:
    params: list[dict[str, Any]] = []
    for name, description in (_ID, _PATH):
        if "{" + name + "}" in op.path:
            params.append(
                {"name": name, "in": "path", "required": True, "description": description,
                 "schema": {"type": "string"}}
            )  # fmt: skip
    for name, kind, description in op.query:
        params.append(
            {"name": name, "in": "query", "required": False, "description": description,
             "schema": {"type": kind}}
        )  # fmt: skip
    responses: dict[str, Any] = {}
    if op.response is None:
        responses[str(op.status)] = {"description": "done, no body"}
    elif isinstance(op.response, str):
        schema: dict[str, Any] = (
            {"type": "object"}
            if op.response == "application/json"
            else {"type": "string", "format": "binary"}
        )
        responses[str(op.status)] = {
            "description": op.summary,
            "content": {op.response: {"schema": schema}},
        }
    else:
        content: dict[str, Any] = {"application/json": {"schema": _ref(op.response)}}
        if op.response is ExecResult:
            content["text/event-stream"] = {"schema": {"type": "string"}}
        responses[str(op.status)] = {"description": op.summary, "content": content}
    for status in sorted({*op.errors, 405, 500}):
        responses[str(status)] = _problem(status)
    operation: dict[str, Any] = {
        "summary": op.summary,
        "operationId": _operation_id(op),
        "parameters": params,
        "responses": responses,
    }
    if op.notes:
        operation["description"] = op.notes
    if op.body == "multipart":
        form: dict[str, Any] = {
            "type": "object",
            "required": ["file"],
            "properties": {"file": {"type": "string", "format": "binary"}},
        }
        if op.response is FileUploaded:
            form["properties"]["path"] = {"type": "string"}
        operation["requestBody"] = {
            "required": True,
            "content": {"multipart/form-data": {"schema": form}},
        }
    elif op.body is not None and not isinstance(op.body, str):
        operation["requestBody"] = {
            "required": op.body is not CreateSandboxRequest,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    return operation


def document() -> dict[str, Any]:
    _, schemas = models_json_schema([(m, "validation") for m in _MODELS], ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sandboxd",
            "version": __version__,
            "description": "Run untrusted code in bubblewrap sandboxes. Over the Unix socket "
            "no credentials are needed; over TCP every request needs the bearer token.",
        },
        "servers": [{"url": "http://sandboxd"}],
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
