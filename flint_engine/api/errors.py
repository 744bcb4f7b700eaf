"""Errors in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`, and the handlers that produce them.

400 invalid parameters (and prompts longer than the context, with the numbers), 401 bad key, 404 unknown model or
route, 413 body too large, 429 per-key concurrency, 503 overloaded (with Retry-After) or engine down; 500 only for
real bugs (logged with the request id, never with prompt text).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..async_engine import EngineDeadError
from ..chat_template import ChatTemplateError
from ..engine import EngineOverloaded, EngineRequestError
from ..sampling_params import SamplingParamsError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


# How a load-shedding refusal's message begins, in either API's error shape (the batch runners retry these).
OVERLOADED = "the server is overloaded, retry later"


def overloaded(message: str) -> APIError:
    return APIError(
        503,
        f"{OVERLOADED} ({message})",
        code="server_overloaded",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def to_api_error(exc: BaseException) -> APIError | None:
    """Map engine-side exceptions to API errors (None: an unexpected error)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineRequestError):
        return APIError(400, str(exc), exc.param, exc.code)
    if isinstance(exc, SamplingParamsError):
        return APIError(400, str(exc), exc.field)
    if isinstance(exc, ChatTemplateError):
        return APIError(400, f"messages cannot be rendered: {exc}", "messages")
    if isinstance(exc, EngineOverloaded):
        return overloaded(str(exc))
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)})
    return None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _field_path(loc: tuple[Any, ...]) -> list[str]:
    """A validation error's location as the request's field names: without "body" and the union-branch tags pydantic
    adds ('str', 'list[TextPart]', "literal['none','auto']", 'NamedToolChoice')."""
    out = []
    for part in loc:
        text = str(part)
        if part == "body" or (not isinstance(part, int) and (text in _TYPE_TAGS or "[" in text or text[:1].isupper())):
            continue
        out.append(text)
    return out


def validation_problem(error: Any) -> str:
    """One pydantic error's message; our validators' own (value errors) without pydantic's "Value error, "."""
    if error.get("type") == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])
    return str(error.get("msg", "invalid value"))


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    # A value that fails a union fails each branch; the branch that got deepest into the value says what is wrong.
    top = _field_path(errors[0].get("loc", ()))[:1]
    same_field = [e for e in errors if _field_path(e.get("loc", ()))[:1] == top]
    first = max(same_field, key=lambda e: len(_field_path(e.get("loc", ()))))
    loc = _field_path(first.get("loc", ()))
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    msg = validation_problem(first)
    if first.get("type") == "value_error" and loc and msg.startswith(loc[-1]):  # the message names its field
        return msg, param
    return (f"invalid '{param}': {msg}" if param else msg), param


def validation_error(exc: ValidationError) -> APIError:
    """A request model's validation failure as the 400 the client gets."""
    message, param = _validation_message(RequestValidationError(exc.errors()))
    return APIError(400, message, param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    async def _mapped(request: Request, exc: Exception) -> JSONResponse:
        api = to_api_error(exc)
        assert api is not None
        return error_response(api.status, api.message, api.param, api.code, api.headers)

    # Registered per class so they are handled inside the app (a bare Exception handler is also re-raised).
    for cls in (EngineRequestError, SamplingParamsError, ChatTemplateError, EngineOverloaded, EngineDeadError):
        app.add_exception_handler(cls, _mapped)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        mapped = to_api_error(exc)
        if mapped is not None:
            return error_response(mapped.status, mapped.message, mapped.param, mapped.code, mapped.headers)
        rid = request.headers.get("x-request-id", "-")
        log.error(
            "internal error on %s %s (request %s): %s",
            request.method,
            request.url.path,
            rid,
            type(exc).__name__,
            exc_info=exc,
        )
        return error_response(500, "internal server error", code="internal_error")
