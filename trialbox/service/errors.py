"""How failures become HTTP answers. Every error body is JSON:

    {"error": "<kind>", "message": "<what happened and what to change>", "field": "<name>"}

| raised                         | status | kind          | notes                          |
|--------------------------------|--------|---------------|--------------------------------|
| malformed JSON body            | 400    | `bad_json`    |                                |
| a field fails validation       | 422    | `invalid`     | `field` names it (`run_timeout`) |
| `UnknownLanguage`              | 400    | `bad_language`| `field`: `language`            |
| `NotFound`                     | 404    | `not_found`   | unknown session / submission   |
| other `UsageError`             | 400    | `usage`       |                                |
| `Overloaded`                   | 503    | `overloaded`  | `Retry-After`                  |
| `InfraError`                   | 503    | `infra`       | `Retry-After`; never a verdict |
| `DeadlineExpired`              | 504    | `deadline`    | the run was stopped            |
| `ClientLimit`                  | 429    | `client_limit`| `Retry-After`; per-client cap  |
| (guard) Host not this server's | 403    | `host_not_allowed` | no token set              |
| (guard) Origin another site's  | 403    | `origin_not_allowed` | POST/PUT/DELETE, no token |
| (guard) no/bad token           | 401    | `auth`        | `WWW-Authenticate: Bearer`     |
| (guard) body too large         | 413    | `too_large`   | before it is read; then closed |
| (guard) body stalled           | 408    | (`detail`)    | `read_timeout_s` between pieces |
| (guard) rate limit             | 429    | `rate_limited`| `Retry-After`                  |
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from trialbox.errors import InfraError, UnknownLanguage, Unavailable, UsageError
from trialbox.service.admission import Overloaded


class NotFound(UsageError):
    """The request names something this server does not have (session, submission)."""


class DeadlineExpired(Unavailable):
    """The request's deadline passed; whatever it ran has been stopped."""


class ClientLimit(UsageError):
    """This client holds as much of something as one client may (sessions); others
    still can. `retry_after` in seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class FieldError(UsageError):
    """A request field's value is unusable; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def error_body(kind: str, message: str, field: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": kind, "message": message}
    if field is not None:
        body["field"] = field
    return body


def error_response(status: int, kind: str, message: str, field: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(kind, message, field), status_code=status, headers=headers)


def _loc(loc: Any) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errs = list(exc.errors())
    for e in errs:
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            return error_response(400, "bad_json", "the request body is not valid JSON: "
                                  f"{ctx.get('error', e.get('msg'))}; send a JSON object")
    first = errs[0] if errs else {"loc": ("body",), "msg": "invalid request"}
    raw = first.get("input")
    if tuple(first.get("loc", ())) == ("body",) and isinstance(raw, (bytes, str)):
        # A body FastAPI did not parse as JSON (no JSON content type): say which it is.
        try:
            json.loads(raw)
        except ValueError as e:
            return error_response(400, "bad_json", f"the request body is not valid JSON: "
                                  f"{e}; send a JSON object")
        return error_response(400, "bad_json", "the request body was not read as JSON; "
                              "send it with 'Content-Type: application/json'")
    field = _loc(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value"))
    if field == "body" and first.get("type") == "missing":
        msg = "the request needs a JSON body"
    more = f" (and {len(errs) - 1} more problem(s))" if len(errs) > 1 else ""
    return error_response(422, "invalid", f"{field}: {msg}{more}", field)


async def _usage(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, NotFound):
        return error_response(404, "not_found", str(exc))
    if isinstance(exc, UnknownLanguage):
        return error_response(400, "bad_language", str(exc), "language")
    if isinstance(exc, ClientLimit):
        return error_response(429, "client_limit", str(exc),
                              headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, FieldError):
        return error_response(422, "invalid", f"{exc.field}: {exc}", exc.field)
    return error_response(400, "usage", str(exc))


async def _overloaded(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Overloaded)
    return error_response(503, "overloaded", str(exc),
                          headers={"Retry-After": str(exc.retry_after)})


async def _infra(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "infra", f"infrastructure failure (not the code's fault; "
                          f"retry): {exc}", headers={"Retry-After": "1"})


async def _deadline(request: Request, exc: Exception) -> JSONResponse:
    return error_response(504, "deadline", str(exc))


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(UsageError, _usage)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(InfraError, _infra)
    app.add_exception_handler(DeadlineExpired, _deadline)
