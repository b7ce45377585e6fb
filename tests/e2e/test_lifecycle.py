"""API keys, binding and clean shutdown, each on its own server process."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time

import pytest
from server_process import start_server

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
SECRET = "s3cret-key-do-not-log"


def start_small(tmp_path, *args: str, **kwargs):
    """`start_server` on a 512 MB pool: these tests need little KV, and zeroing the default
    pool (10% of memory) costs seconds a start on a CPU."""
    return start_server(tmp_path, "--kv-budget", "512MB", *args, **kwargs)


def request(url, method, path, body=None, headers=None):
    host, port = url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request(
        method,
        path,
        json.dumps(body) if body is not None else None,
        {"Content-Type": "application/json", **(headers or {})},
    )
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def open_long_stream(url):
    """A streamed chat completion of 2000 tokens; the response, its headers read."""
    host, port = url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {
        "model": MODEL,
        "messages": FRANCE,
        "max_tokens": 2000,
        "stream": True,
        "logit_bias": {"2": -100},
    }
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    return conn.getresponse()


def test_api_key_is_enforced_and_never_logged(tmp_path):
    from openai import AuthenticationError, OpenAI

    srv = start_small(tmp_path, "--api-key", SECRET, "--max-tokens", "12")
    try:
        body = {"model": MODEL, "messages": FRANCE}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": SECRET}):
            status, data = request(srv.url, "POST", "/v1/chat/completions", body, headers)
            assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        assert request(srv.url, "GET", "/v1/models")[0] == 401
        assert request(srv.url, "GET", "/metrics")[0] == 401
        assert request(srv.url, "GET", "/health")[0] == 200
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
        client = OpenAI(base_url=srv.url + "/v1", api_key=SECRET, max_retries=0)
        r = client.chat.completions.create(model=MODEL, messages=FRANCE)
        assert r.choices[0].message.content == "The capital of France is Paris."
        _anthropic_key_checks(srv.url)
    finally:
        assert srv.stop() == 0
    assert SECRET not in srv.log()
    assert "127.0.0.1" in srv.log()  # bound to loopback by default


def _anthropic_key_checks(url: str) -> None:
    """Anthropic's clients send `x-api-key`: the key works there too, in Anthropic's error
    shape when wrong; two credentials that differ are refused."""
    from anthropic import Anthropic, AuthenticationError

    body = {"model": MODEL, "max_tokens": 12, "messages": FRANCE}
    for headers in ({"x-api-key": "wrong"}, {"x-api-key": SECRET, "Authorization": "Bearer x"}):
        status, data = request(url, "POST", "/v1/messages", body, headers)
        assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    with pytest.raises(AuthenticationError):
        Anthropic(base_url=url, api_key="nope", max_retries=0).messages.create(**body)
    reply = Anthropic(base_url=url, api_key=SECRET, max_retries=0).messages.create(
        **body, extra_body={"temperature": 0}
    )
    assert reply.content[0].text == "The capital of France is Paris."


def test_sigterm_finishes_in_flight_requests_and_exits_zero(tmp_path):
    # A grace well beyond the request's time (seconds on a loaded 2-core CPU).
    srv = start_small(tmp_path, "--shutdown-grace", "60")
    result = {}

    def slow_request():
        body = {"model": MODEL, "messages": FRANCE, "max_tokens": 12, "logit_bias": {"2": -100}}
        result["status"], data = request(srv.url, "POST", "/v1/chat/completions", body)
        result["body"] = json.loads(data)

    t = threading.Thread(target=slow_request)
    t.start()
    time.sleep(1.5)  # the request is in flight
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(60) == 0, srv.log()
    t.join(10)
    assert result["status"] == 200
    assert result["body"]["usage"]["completion_tokens"] == 12
    assert result["body"]["choices"][0]["message"]["content"].startswith("The capital of France")


def test_sigint_with_a_stuck_stream_cancels_it_after_the_grace_period(tmp_path):
    srv = start_small(tmp_path, "--shutdown-grace", "1")
    resp = open_long_stream(srv.url)
    data_lines = 0
    while data_lines < 3:  # the stream is under way
        data_lines += resp.fp.readline().startswith(b"data: ")
    srv.proc.send_signal(signal.SIGINT)
    rest = resp.read().decode()
    assert srv.proc.wait(60) == 0, srv.log()
    assert '"error"' in rest and rest.rstrip().endswith("data: [DONE]")
    # New connections are refused once shutdown started.
    with pytest.raises(OSError):
        request(srv.url, "GET", "/health")


def test_api_key_from_the_environment_or_a_file_stays_out_of_the_command_line(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    for args, env in (((), {"MLX_PAGED_API_KEY": SECRET}), (("--api-key-file", str(key_file)), {})):
        srv = start_small(tmp_path, "--max-tokens", "2", *args, env=env)
        try:
            body = {"model": MODEL, "messages": FRANCE}
            assert request(srv.url, "POST", "/v1/chat/completions", body)[0] == 401
            ok = {"Authorization": f"Bearer {SECRET}"}
            assert request(srv.url, "POST", "/v1/chat/completions", body, ok)[0] == 200
            twice = {"Authorization": [f"Bearer {SECRET}", f"Bearer {SECRET}"]}
            assert raw_status(srv.url, "/v1/models", twice) == 401
            assert SECRET not in " ".join(srv.proc.args)
        finally:
            assert srv.stop() == 0
        assert SECRET not in srv.log()


def raw_status(url, path, headers: dict) -> int:
    """GET with headers that may repeat (a list value sends the header once per item)."""
    host, port = url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("GET", path)
    for name, values in headers.items():
        for value in values if isinstance(values, list) else [values]:
            conn.putheader(name, value)
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_sigterm_during_a_long_step_ends_every_stream_and_exits_in_time(tmp_path):
    """A prompt prefilled in one step keeps the engine busy for tens of seconds on a CPU; the
    process still exits within the grace period plus a few seconds, the open stream ends with an
    error event and [DONE], and the prefilling and queued requests get 503: the queued one at
    once, without waiting for the step or the grace period."""
    grace = 4
    srv = start_small(
        tmp_path,
        "--shutdown-grace",
        str(grace),
        "--prefill-step-size",
        "4096",
        "--decode-concurrency",
        "2",
        "--prompt-concurrency",
        "1",
    )
    resp = open_long_stream(srv.url)
    while not resp.fp.readline().startswith(b"data: "):
        pass
    results, answered = {}, {}

    def plain(name, content):
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
        results[name] = request(srv.url, "POST", "/v1/chat/completions", body)
        answered[name] = time.monotonic()

    long_prompt = threading.Thread(target=plain, args=("prefilling", "tell me a story " * 400))
    long_prompt.start()
    time.sleep(1.5)  # its prefill step is running
    queued = threading.Thread(target=plain, args=("queued", "hello"))
    queued.start()
    time.sleep(0.5)
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    rest = resp.read().decode()
    assert srv.proc.wait(30) == 0, srv.log()
    assert time.monotonic() - start < grace + 6
    assert '"error"' in rest and rest.rstrip().endswith("data: [DONE]")
    long_prompt.join(10)
    queued.join(10)
    for name in ("prefilling", "queued"):
        status, data = results[name]
        assert status == 503 and "shutting down" in json.loads(data)["error"]["message"], name
    assert answered["queued"] - start < 1, "the queued request waited for the step to end"


def test_a_model_path_that_does_not_exist_is_named_at_start(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "mlx_paged", "serve", "--model", str(tmp_path / "nonexistent")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert f"--model {tmp_path / 'nonexistent'}: no such folder" in done.stderr
    assert "Repo id" not in done.stderr  # not Hugging Face's repo-id message
