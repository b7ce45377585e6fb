"""What one long prompt does to the streams already decoding: `bench serve --long-prompt N`.

`concurrency` streams start (prompts of `--prompt-tokens`, `--interference-tokens` out each);
once every one has its first token and a second more has passed, one prompt of N tokens
arrives. A stream's inter-token gap counts as "during" when it ends while that prompt is being
prefilled (from its send to its first token), else as "outside". The bar a server wants: ITL
p99 during the prefill within a small multiple of the p50 outside it.
"""

from __future__ import annotations

import threading
import time

from .serve_load import RequestRecord, percentiles, stream_completion


def measure(url: str, stream_bodies: list[dict], long_body: dict, timeout: float) -> dict:
    """Run the streams and the long prompt; ITL percentiles during and outside its prefill."""
    records: list[RequestRecord | None] = [None] * len(stream_bodies)
    started = [threading.Event() for _ in stream_bodies]

    def run(i: int) -> None:
        records[i] = stream_completion(url, stream_bodies[i], timeout, started[i])

    threads = [threading.Thread(target=run, args=(i,), daemon=True)
               for i in range(len(stream_bodies))]  # fmt: skip
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for event in started:
        if not event.wait(max(0.0, deadline - time.monotonic())):
            raise RuntimeError("the streams did not start within the timeout")
    time.sleep(1.0)  # steady decoding before the long prompt arrives
    long = stream_completion(url, long_body, timeout)
    for t in threads:
        t.join()
    if long.error:
        raise RuntimeError(f"the long prompt failed: {long.error}")
    # It asks for one token, so its end marks its prefill's end even when that token has no text.
    prefill_s = long.ttft if long.ttft is not None else long.latency
    window = (long.sent, long.sent + prefill_s)
    during, outside = [], []
    for r in records:
        if r is None or r.error:
            raise RuntimeError(f"a stream failed: {r.error if r else 'no record'}")
        for before, after in zip(r.event_times, r.event_times[1:]):
            (during if window[0] < after <= window[1] else outside).append(after - before)
    return {"streams": len(records), "long_prompt_tokens": long.prompt_tokens,
            "long_prompt_ttft_ms": prefill_s * 1e3, "itl_during_ms": percentiles(during),
            "itl_outside_ms": percentiles(outside), "gaps_during": len(during)}  # fmt: skip
