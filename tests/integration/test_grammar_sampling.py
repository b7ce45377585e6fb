"""Structured output on tiny random-weight models: whatever the weights say, a request with a
JSON schema grammar gives JSON that validates and ends with "stop", on both KV paths, under
continuous batching; rows without a grammar in the same batch give the tokens they give alone."""

from __future__ import annotations

import json

import jsonschema
import pytest

from mlx_paged import LLM, SamplingParams
from mlx_paged.structured.grammars import any_json_object_grammar, json_schema_grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "digit": {"type": "integer", "minimum": 0, "maximum": 9},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["ok", "digit", "color", "tags"],
    "additionalProperties": False,
}
PROMPTS = [list(range(5, 30)), [11, 12, 13], list(range(40, 90)), [7, 8, 9, 10]]


@pytest.fixture(scope="module", params=["paged", "contiguous"])
def llm(request, tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), kv_paged=request.param == "paged", num_blocks=64)


def test_grammar_rows_give_valid_json_and_free_rows_their_own_tokens(llm):
    grammar = json_schema_grammar(SCHEMA, "response_format")
    free = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [r.token_ids for r in llm.generate(PROMPTS[1::2], free)]
    constrained = SamplingParams(max_tokens=160, grammar=grammar, temperature=1.0)
    params = [constrained, free, constrained, free]
    results = llm.generate(PROMPTS, params)
    for result in results[0::2]:
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), SCHEMA)
    assert [r.token_ids for r in results[1::2]] == alone


def test_any_json_object_mode(llm):
    results = llm.generate(
        PROMPTS[:2], SamplingParams(max_tokens=200, grammar=any_json_object_grammar())
    )
    for result in results:
        if result.finish_reason == "stop":  # random weights may nest past the limit
            assert isinstance(json.loads(result.text), dict)
        else:
            assert result.text.startswith("{")


def test_a_grammar_survives_preemption(tiny_model_dir):
    """In a pool too small for all rows at once, rows are preempted and recomputed; each one's
    matcher keeps its place, so the JSON still validates."""
    llm = LLM(str(tiny_model_dir("llama")), num_blocks=16, block_size=16)
    grammar = json_schema_grammar(SCHEMA, "response_format")
    params = SamplingParams(max_tokens=120, grammar=grammar, temperature=1.0)
    results = llm.generate([list(range(5, 45)) for _ in range(8)], params)
    assert llm.engine.metrics.preemptions_total > 0
    for result in results:
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), SCHEMA)


@pytest.mark.parametrize("trigger_len", [1, 2])
def test_a_grammar_after_token_ids_leaves_the_output_up_to_them_free(llm, trigger_len):
    """The output up to and with `grammar_after` (here tokens of the model's own greedy
    output, as `</think>` would be) is the free run's exactly; the rest validates."""
    free = llm.generate([PROMPTS[2]], SamplingParams(max_tokens=24))[0].token_ids
    # The trigger ends where the last token new to the output first appears.
    end = max(i for i, t in enumerate(free) if free.index(t) == i)
    assert end >= trigger_len, free
    trigger = free[end + 1 - trigger_len : end + 1]
    grammar = json_schema_grammar(SCHEMA, "response_format")
    params = SamplingParams(max_tokens=160, grammar=grammar, grammar_after=trigger)
    with_grammar = llm.generate([PROMPTS[2]], params)[0]
    assert with_grammar.token_ids[: end + 1] == free[: end + 1]
    assert with_grammar.finish_reason == "stop"
    answer = llm.tokenizer.decode(with_grammar.token_ids[end + 1 :])
    jsonschema.validate(json.loads(answer), SCHEMA)
