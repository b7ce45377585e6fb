"""The engine's grammar matchers on a real byte-level tokenizer: one compile per grammar, copies
that advance on their own, parallel consumption that refuses a token outside the grammar, and
masks that leave exactly the allowed tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

import mlx_paged.structured.matchers as matchers_module
from mlx_paged.bench.random_models import _byte_level_tokenizer
from mlx_paged.structured.grammars import json_schema_grammar
from mlx_paged.structured.matchers import GrammarMatchers, constrain

VOCAB = 600
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(scope="module")
def tokenizer():
    tok, eos = _byte_level_tokenizer(VOCAB, corpus_bytes=200_000)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos)


def _allowed(grammars: GrammarMatchers, matcher) -> set[int]:
    logits = mx.zeros((1, VOCAB))
    masked = constrain(logits, grammars.masks([matcher]))
    return set(np.flatnonzero(np.isfinite(np.array(masked[0]))).tolist())


def test_copies_of_one_compile_advance_on_their_own(tokenizer):
    grammars = GrammarMatchers(tokenizer, VOCAB)
    grammar = json_schema_grammar(SCHEMA, "response_format")
    first, second = grammars.matcher(grammar), grammars.matcher(grammar)
    assert len(grammars._templates) == 1
    ids = tokenizer.encode('{"ok": true}')
    grammars.consume([(first, t) for t in ids[:1]])
    assert _allowed(grammars, second) != _allowed(grammars, first)
    for t in ids[1:]:
        grammars.consume([(first, t)])
    assert first.is_accepting() and not second.is_accepting()
    assert {tokenizer.decode([t]) for t in _allowed(grammars, second)} >= {"{"}


def test_a_token_outside_the_grammar_is_refused(tokenizer):
    grammars = GrammarMatchers(tokenizer, VOCAB)
    matcher = grammars.matcher(json_schema_grammar(SCHEMA, "response_format"))
    outside = tokenizer.encode("x")[0]
    assert outside not in _allowed(grammars, matcher)
    with pytest.raises(RuntimeError, match="left the grammar"):
        grammars.consume([(matcher, outside)])


def test_rows_without_a_matcher_allow_every_token(tokenizer):
    grammars = GrammarMatchers(tokenizer, VOCAB)
    matcher = grammars.matcher(json_schema_grammar(SCHEMA, "response_format"))
    masked = constrain(mx.zeros((2, VOCAB)), grammars.masks([None, matcher]))
    finite = np.isfinite(np.array(masked))
    assert finite[0].all() and 0 < finite[1].sum() < VOCAB


def test_compiled_grammars_kept_are_bounded(tokenizer, monkeypatch):
    monkeypatch.setattr(matchers_module, "TEMPLATES", 2)
    grammars = GrammarMatchers(tokenizer, VOCAB)
    made = [json_schema_grammar({"enum": [f"v{i}"]}, "response_format") for i in range(3)]
    for grammar in made:
        grammars.matcher(grammar)
    grammars.matcher(made[1])  # used again: kept over the older one
    assert list(grammars._templates) == [made[2], made[1]]


def test_draft_masks_follow_the_draft_and_cut_it_where_the_grammar_refuses(tokenizer):
    grammars = GrammarMatchers(tokenizer, VOCAB)
    grammar = json_schema_grammar(SCHEMA, "response_format")
    matcher, other = grammars.matcher(grammar), grammars.matcher(grammar)
    ids = tokenizer.encode('{"ok": true}')
    refused = tokenizer.encode("x")[0]
    drafts = [ids[:3], [ids[0], refused, ids[2]], [5, 6]]
    words = grammars.draft_masks([matcher, other, None], drafts)
    # The first draft whole (4 rows), the second cut after its first token (2), the free row's
    # pending token and draft (3 rows of every token allowed).
    assert drafts[:2] == [ids[:3], ids[:1]] and words.shape[0] == 4 + 2 + 3
    masked = np.isfinite(np.array(constrain(mx.zeros((words.shape[0], VOCAB)), mx.array(words))))
    for row, token in enumerate(ids[:3]):
        assert masked[row, token] and masked[row].sum() < VOCAB
    assert masked[4, ids[0]] and not masked[5, refused]
    assert masked[6:].all()
    grammars.consume([(matcher, t) for t in ids])  # the matcher was left at its start
    assert matcher.is_accepting()
