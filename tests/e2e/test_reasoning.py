"""A reasoning model's thinking apart from its answer, through the real server: a tiny random
model whose template opens `<think>` (markers as mlx-lm detects them), with both clients. What
the model writes inside the block comes back as `reasoning_content` (OpenAI) or a `thinking`
block (Anthropic), streamed as such; `enable_thinking: false` leaves it all answer."""

from __future__ import annotations

import json

import jsonschema
import pytest
from server_process import start_server
from tiny_models import build_model

MAX_TOKENS = 10
SCHEMA = {
    "type": "object",
    "properties": {"sky": {"enum": ["blue", "grey"]}, "sure": {"type": "boolean"}},
    "required": ["sky", "sure"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    folder = build_model(tmp_path_factory.mktemp("thinker") / "m", "llama", thinking=True)
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(folder)
    assert tokenizer.has_thinking
    server = start_server(folder.parent, "--model", str(folder), "--log-level", "WARNING")
    # Neither the block's end nor EOS: every token stays inside the thinking block.
    bias = {str(tokenizer.think_end_id): -100, str(tokenizer.eos_token_id): -100}
    yield server, tokenizer, bias
    assert server.stop() == 0, server.log()


def test_thinking_is_reasoning_content_whole_and_streamed(thinker):
    from openai import OpenAI

    server, tokenizer, bias = thinker
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = dict(model="default", messages=ASK, max_tokens=MAX_TOKENS, logit_bias=bias)
    reply = client.chat.completions.create(**ask)
    message = reply.choices[0].message
    thought = message.model_extra["reasoning_content"]
    # The same prompt as a plain completion: its text is exactly the thinking.
    prompt = tokenizer.apply_chat_template(ASK, add_generation_prompt=True)
    raw = client.completions.create(
        model="default", prompt=list(prompt), max_tokens=MAX_TOKENS, logit_bias=bias
    )
    assert thought == raw.choices[0].text and thought and message.content == ""
    stream = client.chat.completions.create(**ask, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == ""
    off = client.chat.completions.create(
        **ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert (
        off.choices[0].message.content
        and "reasoning_content" not in off.choices[0].message.model_extra
    )


def test_thinking_blocks_on_anthropics_api(thinker):
    """Unbiased, the model may close the block: the thinking block and the text block are the
    plain completion's text on either side of `</think>`."""
    from anthropic import Anthropic
    from openai import OpenAI

    server, tokenizer, _ = thinker
    prompt = tokenizer.apply_chat_template(ASK, add_generation_prompt=True)
    openai = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = openai.completions.create(model="default", prompt=list(prompt), max_tokens=MAX_TOKENS)
    thought, _, answer = raw.choices[0].text.partition("</think>")
    expected = [("thinking", thought)] if thought else []
    expected += [("text", answer.lstrip("\n"))] if answer.lstrip("\n") else []
    claude = Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    ask = dict(model="default", max_tokens=MAX_TOKENS, messages=ASK)
    reply = claude.messages.create(**ask)
    with claude.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    for message in (reply, streamed):
        blocks = [(b.type, b.thinking if b.type == "thinking" else b.text) for b in message.content]
        assert blocks == expected


def test_a_structured_answer_follows_the_thinking(thinker):
    """The grammar is the answer's: biased to close its block at once, the model's answer
    after `</think>` is JSON that validates (the engine's tests cover thinking of some length
    before the grammar starts); with thinking off, the whole output is."""
    from openai import OpenAI

    server, tokenizer, _ = thinker
    closes = {str(tokenizer.think_end_id): 100}
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    reply = client.chat.completions.create(model="default", messages=ASK, max_tokens=60,
                                           logit_bias=closes, response_format=fmt)  # fmt: skip
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop", message
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert not message.model_extra.get("reasoning_content")
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    reply = client.chat.completions.create(model="default", messages=ASK, max_tokens=60,
                                           response_format=fmt, extra_body=off)  # fmt: skip
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
