"""The error bodies the server answers with: OpenAI's shape on its routes, Anthropic's on the
Messages routes."""

from __future__ import annotations

import json

OPENAI_ERROR_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    500: "server_error",
    501: "not_implemented_error",
    503: "service_unavailable",
    505: "invalid_request_error",
}
# Anthropic's error types by status, for the Messages routes.
ANTHROPIC_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_body(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    anthropic: bool = False,
) -> bytes:
    """OpenAI's error shape, or with `anthropic` Anthropic's."""
    if anthropic:
        kind = ANTHROPIC_ERROR_TYPES.get(
            status, "invalid_request_error" if status < 500 else "api_error"
        )
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        kind = OPENAI_ERROR_TYPES.get(
            status, "invalid_request_error" if status < 500 else "server_error"
        )
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json.dumps(body, ensure_ascii=False).encode()
