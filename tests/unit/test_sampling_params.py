import pytest

from mlx_paged.errors import InvalidRequestError
from mlx_paged.request import RequestRuntime
from mlx_paged.sampling.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", 2.5),
        ("max_tokens", True),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("min_p", 2.0),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("repetition_context_size", 0),
        ("seed", "7"),
        ("seed", 1.5),
        ("top_logprobs", 21),
        ("top_logprobs", -1),
        ("xtc_probability", 1.5),
        ("stop", [""]),
        ("stop", ["x"] * 17),
        ("stop", ["y" * 257]),
        ("logit_bias", {1: 500}),
        # Values MLX cannot hold, which used to throw inside the shared engine step.
        ("repetition_penalty", 10**19),
        ("repetition_penalty", 101),
        ("logit_bias", {5: 10**19}),
        ("repetition_context_size", 10**19),
        ("presence_context_size", 2**31),
        ("seed", -1),
        ("seed", 2**64),
        ("seed", True),
        ("stop_token_ids", [1.5]),
        ("grammar_after", [3]),  # without a grammar
        ("grammar", 5),
    ],
)
def test_out_of_range_fields_name_themselves(field, value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field
    assert info.value.message.startswith(f"{field}: ")


def test_defaults_are_greedy_and_batchable():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (0.0, 1.0, 0, 0.0, 256)
    assert p.is_batchable


def test_seed_makes_a_request_unbatchable():
    assert not SamplingParams(seed=3).is_batchable


def test_single_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]


def test_token_ids_are_checked_against_the_vocabulary():
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(logit_bias={100: 1.0}).validate(vocab_size=50)
    assert info.value.param == "logit_bias"
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(stop_token_ids=[60]).validate(vocab_size=50)
    assert info.value.param == "stop_token_ids"
    SamplingParams(logit_bias={49: -1.0}, stop_token_ids=[0]).validate(vocab_size=50)
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(grammar="start: /x/", grammar_after=[2, 50]).validate(vocab_size=50)
    assert info.value.param == "grammar_after" and "token id 50 " in info.value.message


def test_a_waiting_grammar_starts_after_its_token_ids():
    runtime = RequestRuntime(matcher=object(), grammar_after=(7, 8))
    seen = []
    for token in (8, 7, 7, 8, 9):
        seen.append((runtime.advance_grammar(token), runtime.active_matcher is not None))
    # Noted while waiting; the pair 7, 8 starts it, and the next token is the matcher's.
    assert seen == [(True, False), (True, False), (True, False), (True, True), (False, True)]


def test_top_k_must_be_below_the_vocabulary():
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(temperature=1.0, top_k=50).validate(vocab_size=50)
    assert info.value.param == "top_k" and "0 turns it off" in info.value.message
    SamplingParams(temperature=1.0, top_k=49).validate(vocab_size=50)


def test_numbers_reach_mlx_as_floats_and_seeds_span_64_bits():
    p = SamplingParams(temperature=1, repetition_penalty=2, logit_bias={3: 7}, seed=2**64 - 1)
    assert isinstance(p.temperature, float) and isinstance(p.repetition_penalty, float)
    assert isinstance(p.logit_bias[3], float) and p.seed == 2**64 - 1
