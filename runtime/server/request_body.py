"""A request body from the socket to a JSON object, refusing what could hurt the server: bodies
without an honest length, too large, too slow, nested too deep, or not valid Unicode."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable

from mlx_paged.errors import InvalidRequestError

MAX_JSON_DEPTH = 64
_DIGITS = re.compile(r"[0-9]{1,19}")


def _err(message: str, status: int = 400, code=None) -> InvalidRequestError:
    return InvalidRequestError(message, status=status, code=code)


def content_length(headers, max_bytes: int) -> int:
    """The body's length from its one Content-Length header.

    Raises:
        InvalidRequestError: 411 without one (or with a Transfer-Encoding, which is not read),
            400 when duplicated or not a non-negative integer, 413 above `max_bytes`.
    """
    if headers.get("Transfer-Encoding") is not None:
        raise _err(
            "Transfer-Encoding bodies are not accepted: send the body with a Content-Length header",
            status=411,
        )
    values = headers.get_all("Content-Length") or []
    if not values:
        raise _err("a Content-Length header is required", status=411)
    if len(values) > 1:
        raise _err("the request has more than one Content-Length header")
    if not _DIGITS.fullmatch(values[0].strip()):
        raise _err(f"Content-Length must be a non-negative integer, got {values[0]!r}")
    n = int(values[0])
    if n > max_bytes:
        raise _err(
            f"the request body is {n} bytes; the limit is {max_bytes} (--max-request-bytes)",
            status=413,
            code="request_too_large",
        )
    return n


def read_exactly(
    read: Callable[[int], bytes], n: int, cut_reason: Callable[[], str | None]
) -> bytes:
    """Read the `n` bytes Content-Length announced; 408 when the server cut the read (its
    deadline, or an eviction at the connection cap: `cut_reason` says which), 400 when the
    client ended the body early."""
    chunks, got = [], 0
    while got < n:
        chunk = read(min(n - got, 1 << 20))
        if not chunk:
            reason = cut_reason()
            if reason is not None:
                raise _err(
                    f"{reason}: {got} of the {n} body bytes came",
                    status=408,
                    code="request_timeout",
                )
            raise _err(
                f"the request body ended after {got} of the {n} bytes its Content-Length announced"
            )
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def parse_json_body(raw: bytes) -> dict:
    """Decode a JSON object body or raise a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _err("the request body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise _err(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise _err(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:  # an integer past Python's digit limit for int(str)
        raise _err(
            f"the request body holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from None
    if not isinstance(body, dict):
        raise _err("the request body must be a JSON object")
    _check_json_values(body)
    return body


def _check_json_values(body: dict) -> None:
    """Refuse nesting deeper than `MAX_JSON_DEPTH` and strings that are not valid Unicode (a
    lone surrogate from a `\\ud800` escape, which no tokenizer or reply could encode)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _err(f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
            stack.extend((k, depth) for k in value)
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _err(
                    "the request body holds a string with a lone UTF-16 surrogate "
                    "(an unpaired \\ud800-\\udfff escape), which is not valid Unicode"
                ) from None
