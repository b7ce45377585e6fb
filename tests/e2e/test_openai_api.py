"""The real server, driven by the official `openai` client, with SmolLM2."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with urllib.request.urlopen(server.url + "/health") as r:
        assert json.load(r) == {"status": "ok"}


def test_chat_answers_paris_with_usage(client):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion" and r.model == MODEL
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (37, 8)
    assert r.usage.total_tokens == 45


def test_default_names_the_served_model_and_unknown_fields_are_logged_once(server, client):
    for _ in range(2):
        r = client.completions.create(
            model="default", prompt="Paris is", max_tokens=2, extra_body={"frobnicate": 1}
        )
        assert r.model == MODEL and r.choices[0].text
    log = server.log()
    assert log.count("ignoring unknown request field 'frobnicate' (logged once per name)") == 1


def test_the_root_path_is_named_in_its_404(server):
    try:
        urllib.request.urlopen(server.url + "/")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
        assert json.load(exc)["error"]["message"] == "no route for GET /"
    else:
        raise AssertionError("GET / answered 200")


def test_chat_stream_equals_non_stream_and_reports_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=FRANCE, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_completions_plain_and_streamed(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens == 5 and r.object == "text_completion"
    streamed = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text
    assert "Paris" in r.choices[0].text


@pytest.mark.parametrize(
    "stop,expected",
    [
        (" Paris", "The capital of France is"),
        ("aris", "The capital of France is P"),  # ends inside a token
        ("France is", "The capital of "),  # spans two tokens
        (["zzz", "of"], "The capital "),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_never_emitted(client, stop, expected, stream):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, stop=stop, stream=stream)
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        text, reason = r.choices[0].message.content, r.choices[0].finish_reason
    assert (text, reason) == (expected, "stop")


def test_max_tokens_and_max_completion_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=3)
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 3)
    assert r.choices[0].message.content == "The capital of"
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, max_completion_tokens=2)
    assert r.usage.completion_tokens == 2


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=FRANCE, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token  # greedy
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    c = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=3, logprobs=1
    )
    assert len(c.choices[0].logprobs.tokens) == 3


def test_concurrent_requests_each_get_their_own_answer(client):
    questions = [
        "What is the capital of France?",
        "What is 2 + 2?",
        "What do bees make?",
        "What is the largest planet?",
    ]

    def ask(q):
        r = client.chat.completions.create(
            model=MODEL, max_tokens=12, messages=[{"role": "user", "content": q}]
        )
        return r.choices[0].message.content

    alone = [ask(q) for q in questions]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(questions)) as pool:
        together = list(pool.map(ask, questions))
    assert together == alone
    assert "Paris" in together[0] and len(set(together)) == len(questions)


def test_disconnect_mid_stream_cancels_and_frees(server):
    before = metrics(server).get('mlx_paged_requests_finished_total{reason="abort"}', 0)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": FRANCE,
            "stream": True,
            "max_tokens": 400,
            "logit_bias": {"2": -100},
        }
    )
    host, port = server.url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    data_lines = 0
    while data_lines < 4:
        if resp.fp.readline().startswith(b"data: "):
            data_lines += 1
    resp.close()  # the client hangs up mid-stream
    conn.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = metrics(server)
        if (
            m["mlx_paged_requests_running"] == 0
            and m.get('mlx_paged_requests_finished_total{reason="abort"}', 0) == before + 1
        ):
            break
        time.sleep(0.2)
    assert m["mlx_paged_requests_running"] == 0
    assert m['mlx_paged_requests_finished_total{reason="abort"}'] == before + 1
    assert m["mlx_paged_kv_cache_bytes"] == 0


def test_metrics_names(server):
    m = metrics(server)
    for name in (
        "mlx_paged_requests_running",
        "mlx_paged_requests_waiting",
        "mlx_paged_preemptions_total",
        "mlx_paged_prefix_cache_hit_tokens_total",
        "mlx_paged_generation_tokens_total",
    ):
        assert name in m
    assert m["mlx_paged_generation_tokens_total"] > 0
    # The start log and the metrics count the same usable blocks; the pool's bytes add the
    # null block.
    usable = int(re.search(r"paged KV: (\d+) usable blocks", server.log()).group(1))
    assert m["mlx_paged_kv_blocks_total"] == usable
    block_bytes = m["mlx_paged_kv_block_size"] * m["mlx_paged_kv_bytes_per_token"]
    assert m["mlx_paged_kv_pool_bytes"] == (usable + 1) * block_bytes
    assert server.log().count("serving 'SmolLM2-135M-Instruct' on http://") == 1
    # On this CPU machine every decode step ran the reference attention, none the kernel.
    assert m['mlx_paged_attention_calls_total{path="reference",phase="decode"}'] > 0
    assert m['mlx_paged_attention_calls_total{path="kernel",phase="decode"}'] == 0


def test_both_processes_keep_startup_objects_out_of_gc_passes(server):
    # The front and the engine process each freeze what startup made, once serving starts.
    frozen = re.findall(r"(\d+) startup objects kept out of garbage collection", server.log())
    assert len(frozen) >= 2 and all(int(n) > 10_000 for n in frozen)


def test_request_logs_do_not_carry_headers(server):
    assert re.search(r"POST /v1/chat/completions HTTP/1.1\" 200", server.log())
    assert "Authorization" not in server.log()


def test_prefix_cache_hits_show_in_usage(client):
    system = {"role": "system", "content": "You answer in one short sentence. " * 12}
    ask = lambda q: client.chat.completions.create(  # noqa: E731
        model=MODEL, max_tokens=4, messages=[system, {"role": "user", "content": q}]
    )
    first = ask("What is the capital of Spain?")
    second = ask("What is the capital of Peru?")
    assert second.usage.prompt_tokens_details.cached_tokens >= 64
    assert second.usage.prompt_tokens_details.cached_tokens % 16 == 0
    assert first.choices[0].finish_reason in ("stop", "length")


def test_a_chats_next_turn_hits_its_previous_prompt_and_answer(client):
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    previous = None
    for question in ("Name a fruit.", "And its colour?", "Name another.", "Which is sweeter?",
                     "Thanks, bye."):  # fmt: skip
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0
        )
        usage = reply.usage
        if previous is not None:
            # The previous prompt and answer, up to their last full block of 16 (SmolLM2's
            # template renders the answer as its sampled tokens, closing token included).
            covered = (previous.prompt_tokens + previous.completion_tokens) // 16 * 16
            assert usage.prompt_tokens_details.cached_tokens >= covered, (previous, usage)
        previous = usage
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
