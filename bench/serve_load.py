"""The load `bench serve` puts on an OpenAI-compatible server: streamed `/v1/completions`
requests, either a fixed number in flight (concurrency) or arriving as a Poisson process (rate),
timed from the client's side of the socket.

Token timing comes from the SSE events: TTFT is the time to the first event that carries text,
ITL the gaps between such events (both servers send one event per token unless a token ends
inside a UTF-8 character), and output tokens are the usage the server reports at the end. A
request whose first token ends it (end of sequence) has no TTFT; one whose stream stops before
`data: [DONE]` is an error.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from its send (`sent`, and the text
    events' `event_times`, are `time.perf_counter()` readings)."""

    sent: float = 0.0
    event_times: list[float] = field(default_factory=list)
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


def parse_event(line: bytes) -> dict | None:
    """The JSON of one `data:` line of an SSE stream; None for other lines and `[DONE]`."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == b"[DONE]":
        return None
    return json.loads(payload)


def stream_completion(
    url: str, body: dict, timeout: float, first_token: threading.Event | None = None
) -> RequestRecord:
    """Send one streamed completion and time its events; `first_token` is set at its first
    text (or when it ends without any)."""
    record = RequestRecord()
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    start = record.sent = time.perf_counter()
    last = None
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        if response.status != 200:
            record.error = f"HTTP {response.status}: {response.read(300)!r}"
            return record
        done = False
        for line in response:
            if line.startswith(b"data: [DONE]"):
                done = True
                break  # a keep-alive connection stays open after the stream's end
            event = parse_event(line)
            if event is None:
                continue
            now = time.perf_counter() - start
            for choice in event.get("choices", ()):
                record.text += choice.get("text") or ""
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
            if any(c.get("text") for c in event.get("choices", ())):
                record.event_times.append(start + now)
                if last is None:
                    record.ttft = now
                    if first_token is not None:
                        first_token.set()
                else:
                    record.itls.append(now - last)
                last = now
            if event.get("usage"):
                record.output_tokens = event["usage"]["completion_tokens"]
                record.prompt_tokens = event["usage"]["prompt_tokens"]
        if not done:
            record.error = "the stream ended before data: [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        record.latency = time.perf_counter() - start
        conn.close()
        if first_token is not None:
            first_token.set()
    return record


def request_body(model: str, prompt: str, max_tokens: int) -> dict:
    """A greedy streamed completion that reports usage at its end."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


def run_concurrency(url: str, bodies: list[dict], concurrency: int, timeout: float):
    """Every body sent with `concurrency` requests in flight; (records, wall seconds)."""
    tic = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        records = list(pool.map(lambda b: stream_completion(url, b, timeout), bodies))
    return records, time.perf_counter() - tic


def run_rate(url: str, bodies: list[dict], rate: float, timeout: float, seed: int = 0):
    """Every body sent at Poisson arrivals of `rate` requests/s; (records, wall seconds)."""
    rng = random.Random(seed)
    records: list[RequestRecord | None] = [None] * len(bodies)

    def send(i: int) -> None:
        records[i] = stream_completion(url, bodies[i], timeout)

    threads = []
    tic = time.perf_counter()
    due = tic
    for i in range(len(bodies)):
        due += rng.expovariate(rate)
        time.sleep(max(0.0, due - time.perf_counter()))
        threads.append(threading.Thread(target=send, args=(i,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - tic


def percentiles(values: list[float], scale: float = 1e3) -> dict:
    """p50/p90/p99 of `values` times `scale` (seconds to ms by default); None when empty."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return {"p50": qs[49] * scale, "p90": qs[89] * scale, "p99": qs[98] * scale}


def summarize(records: list[RequestRecord], wall: float) -> dict:
    """Output tok/s over the wall time, and TTFT / ITL / end-to-end latency percentiles in ms,
    over the requests that succeeded; errors counted with their first message."""
    ok = [r for r in records if r.error is None]
    errors = [r.error for r in records if r.error is not None]
    return {
        "requests": len(records),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "output_tokens": sum(r.output_tokens for r in ok),
        "output_tok_s": sum(r.output_tokens for r in ok) / wall if wall > 0 else 0.0,
        "mean_prompt_tokens": statistics.fmean(r.prompt_tokens for r in ok) if ok else 0.0,
        "wall_s": wall,
        "ttft_ms": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "itl_ms": percentiles([x for r in ok for x in r.itls]),
        "e2e_ms": percentiles([r.latency for r in ok]),
    }
