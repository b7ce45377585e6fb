"""Raw HTTP over a socket, for requests no well-behaved client would send, and a parser for
what comes back."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    interim: int  # 1xx responses before the final one

    def json(self):
        return json.loads(self.body)


def address(url: str) -> tuple[str, int]:
    host, port = url[len("http://") :].split(":")
    return host, int(port)


def read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def parse_reply(data: bytes) -> Reply:
    """The final response in `data` (after any 1xx), its body cut to Content-Length."""
    interim = 0
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"no complete response head in {data[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            interim += 1
            data = rest
            continue
        if "content-length" in headers:
            rest = rest[: int(headers["content-length"])]
        return Reply(status, headers, rest, interim)


def exchange(url: str, data: bytes, timeout: float = 60, half_close: bool = False) -> bytes:
    """Send `data` on a new connection and read until the server closes it."""
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return read_all(sock, timeout)


def post_bytes(path: str, body: bytes, headers: str = "") -> bytes:
    """A POST request with a correct Content-Length and `Connection: close`."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body


def assert_shaped_error(reply: Reply, status: int, fragment: str = "") -> dict:
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers["content-type"] == "application/json"
    err = reply.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert fragment in err["message"], err
    return err
