"""The connection cap and request deadlines, on real socket pairs."""

from __future__ import annotations

import socket
import time

import pytest

from mlx_paged.server.connections import ConnectionGuard


@pytest.fixture
def guard():
    g = ConnectionGuard(max_connections=2, request_timeout=0.5)
    yield g
    g.close()


@pytest.fixture
def pairs():
    made = [socket.socketpair() for _ in range(3)]
    yield made
    for a, b in made:
        a.close()
        b.close()


def test_at_the_cap_a_newcomer_replaces_the_longest_waiting(guard, pairs):
    (a, _), (b, _), (c, _) = pairs
    assert guard.admit(a) and guard.admit(b)
    assert guard.admit(c) and guard.num_open == 2
    a.settimeout(5)
    assert a.recv(1) == b""  # its read side was shut: the handler sees end-of-file
    assert "--max-connections" in guard.cut_reason(a)  # answered 408, not "body ended"
    assert guard.cut_reason(b) is None and guard.cut_reason(c) is None
    guard.release(a)
    assert guard.cut_reason(a) is None


def test_when_all_are_busy_a_newcomer_is_refused(guard, pairs):
    (a, _), (b, _), (c, _) = pairs
    guard.admit(a)
    guard.admit(b)
    guard.busy(a)
    guard.busy(b)
    assert not guard.admit(c)
    guard.release(a)
    assert guard.admit(c)


def test_a_request_past_its_deadline_is_cut_and_a_busy_one_is_not(guard, pairs):
    (a, _), (b, _), _ = pairs
    guard.admit(a)
    guard.admit(b)
    guard.busy(b)
    a.settimeout(5)
    start = time.monotonic()
    assert a.recv(1) == b""
    assert 0.4 < time.monotonic() - start < 2 and guard.timed_out(a)
    assert "--request-timeout" in guard.cut_reason(a)
    assert not guard.timed_out(b)
    guard.waiting(b)  # its response is done: the next request has a deadline again
    b.settimeout(5)
    assert b.recv(1) == b"" and guard.timed_out(b)


def test_pending_bytes_reserve_what_fits_and_release_it():
    from mlx_paged.server.pending_bytes import PendingBytes

    pending = PendingBytes(limit=100)
    assert pending.try_reserve(60) and not pending.try_reserve(41)
    assert pending.used == 60 and pending.try_reserve(40) and pending.used == 100
    pending.release(60)
    assert pending.try_reserve(50) and pending.used == 90
