"""Grammars of structured output, as llguidance takes them: a request's JSON schema (or any
JSON object) becomes a grammar string that travels in `SamplingParams.grammar` to the engine,
which constrains sampling with it (`structured/matchers.py`).

llguidance builds token masks from a grammar lazily, a few tens of microseconds a token, so a
grammar costs no compile step; what is checked here, before a request is queued, is that it
parses and that its schema is one llguidance supports.
"""

from __future__ import annotations

import json
import threading

import llguidance
import llguidance.hf

from mlx_paged.errors import InvalidRequestError

_LOCK = threading.Lock()
# JSON in one layout: `{"a": 1, "b": [2, 3]}`. With whitespace free, small models can loop on
# newlines and spaces until max_tokens; a schema's own "x-guidance" options win.
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# (id of the HF tokenizer, logits width) -> (that tokenizer, kept alive, and its LLTokenizer).
_TOKENIZERS: dict[tuple[int, int | None], tuple] = {}


def ll_tokenizer(hf_tokenizer, vocab_size: int | None = None) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face fast tokenizer (made once per tokenizer and logits
    width: about half a second for a 50k vocabulary)."""
    key = (id(hf_tokenizer), vocab_size)
    with _LOCK:
        if key not in _TOKENIZERS:
            made = llguidance.hf.from_tokenizer(hf_tokenizer, vocab_size)
            _TOKENIZERS[key] = (hf_tokenizer, made)
        return _TOKENIZERS[key][1]


def json_schema_grammar(schema, param: str) -> str:
    """The grammar of JSON values that validate against `schema` (a JSON Schema object), in
    the `COMPACT` layout unless the schema says otherwise."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param}: the schema must be a JSON object", param=param)
    try:
        schema = {"x-guidance": COMPACT, **schema}
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"{param}: {exc}", param=param) from None


def any_json_object_grammar() -> str:
    """The grammar of any JSON object (OpenAI's `json_object` mode)."""
    return json_schema_grammar({"type": "object"}, "response_format")


def check_grammar(grammar: str, hf_tokenizer, param: str) -> None:
    """Raise a 400 naming `param` unless llguidance takes `grammar` (an unsupported schema
    keyword, a bad reference, an empty language)."""
    error = llguidance.LLMatcher.validate_grammar(grammar, ll_tokenizer(hf_tokenizer))
    if error:
        raise InvalidRequestError(f"{param}: the schema cannot constrain output: {error}",
                                  param=param)  # fmt: skip
