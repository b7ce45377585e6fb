"""`bench serve`'s pure parts: SSE parsing, the summary's arithmetic, the table's ratios."""

import pytest

from mlx_paged.bench.serve_load import RequestRecord, parse_event, summarize
from mlx_paged.bench.serve_report import rows


def test_parse_event_reads_data_lines_only():
    assert parse_event(b'data: {"choices": [{"text": "a"}]}\n') == {"choices": [{"text": "a"}]}
    assert parse_event(b"data: [DONE]\n") is None
    assert parse_event(b": keep-alive\n") is None
    assert parse_event(b"\n") is None


def test_summary_counts_tokens_over_wall_time_and_takes_percentiles_of_successes():
    ok = [RequestRecord(ttft=0.1 * (i + 1), itls=[0.01, 0.03], latency=1.0, output_tokens=10,
                        prompt_tokens=20) for i in range(5)]  # fmt: skip
    failed = RequestRecord(error="HTTP 500: b''", output_tokens=99)
    s = summarize([*ok, failed], wall=2.0)
    assert (s["requests"], s["errors"], s["first_error"]) == (6, 1, "HTTP 500: b''")
    assert s["output_tokens"] == 50 and s["output_tok_s"] == 25.0
    assert s["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert s["itl_ms"]["p50"] == pytest.approx(20.0)
    assert s["itl_ms"]["p99"] == pytest.approx(30.0)
    assert s["mean_prompt_tokens"] == 20


def test_rows_give_the_ratio_to_the_peer_and_the_share_of_offline():
    def level(tok_s):
        return {"output_tok_s": tok_s, "ttft_ms": {"p50": 5.0}, "itl_ms": {"p50": 1, "p99": 2},
                "errors": 0}  # fmt: skip

    result = {"servers": {"mlx-paged": {"concurrency 8": level(300.0)},
                          "mlx_lm.server": {"concurrency 8": level(100.0)}},
              "offline": {"concurrency 8": {"output_tok_s": 400.0}}}  # fmt: skip
    [row] = rows(result)
    assert row["ratio"] == 3.0 and row["of_offline"] == 0.75 and row["peer_errors"] == 0
