"""Errors that carry what the client must fix; the server maps them to OpenAI's error shape."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the runtime refuses: bad parameter, too long a prompt, unknown model.

    Attributes:
        param: the offending request field, when one is to blame.
        status: the HTTP status the server answers with.
        code: a short machine-readable reason.
    """

    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
