"""Errors that carry what the client must fix; the server maps them to OpenAI's error shape."""

from __future__ import annotations

from typing import Optional


class InvalidRequestError(ValueError):
    """A request the runtime refuses: bad parameter, too long a prompt, unknown model.

    Attributes:
        param: the offending request field, when one is to blame.
        status: the HTTP status the server answers with.
        code: a short machine-readable reason.
    """

    def __init__(self, message: str, *, param: Optional[str] = None, status: int = 400,
                 code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
