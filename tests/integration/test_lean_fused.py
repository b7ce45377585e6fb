"""`--lean-decode fused` (`models/lean_fused.py`) on the CPU, where each layer kernel call is
its MLX reference: greedy tokens equal mlx-lm's for every family it covers, eager and compiled,
beside prompts joining and leaving, under preemption and with prefill chunks riding in decode
forwards (the plain lean step too); models it cannot serve are refused at load, naming why.
The kernels themselves run in `tests/gpu/test_layer_kernels.py`."""

from __future__ import annotations

import pytest
from mlx_lm import load
from tiny_models import build_model, mlx_lm_greedy

from mlx_paged import LLM, SamplingParams
from mlx_paged.models.lean_decode import LeanDecode
from mlx_paged.models.lean_fused import FUSED_FAMILIES, FusedDecode

PROMPTS = [list(range(5, 24)), [11, 12, 13], list(range(30, 70))]
MAX_TOKENS = 16
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("compile_decode", ["off", "on"])
@pytest.mark.parametrize("model_type", FUSED_FAMILIES)
def test_fused_steps_give_mlx_lms_tokens(tiny_model_dir, model_type, compile_decode):
    path = str(tiny_model_dir(model_type))
    expected = mlx_lm_greedy(load(path)[0], PROMPTS, MAX_TOKENS)
    llm = LLM(path, num_blocks=64, block_size=4, lean_decode="fused",
              compile_decode=compile_decode)  # fmt: skip
    assert isinstance(llm.engine.runner.lean, FusedDecode)
    got = llm.generate(PROMPTS, PARAMS)
    assert [r.token_ids for r in got] == expected


def test_smollm2_fused_steps_give_mlx_lms_tokens(smollm2_dir):
    """The embedded SmolLM2 (real weights, its own tokenizer and chat template)."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    llm = LLM(str(smollm2_dir), block_size=16, num_blocks=64, lean_decode="fused")
    assert isinstance(llm.engine.runner.lean, FusedDecode)
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    eos = llm.tokenizer.eos_token_id
    got = llm.generate([prompt], SamplingParams(max_tokens=12, logit_bias={eos: -100}))[0]
    processors = make_logits_processors(logit_bias={eos: -100})
    want = [r.token for r in stream_generate(llm.model, llm.tokenizer, prompt, max_tokens=12,
                                             logits_processors=processors)]  # fmt: skip
    assert got.token_ids == want and got.text.startswith("The capital of France is Paris.")


def test_quantized_weights_fuse_and_stay_exact(tmp_path):
    """4-bit weights: the stacked projections are quantized matmuls, as the lean step's."""
    from quantized_models import build_quantized_model

    path = build_quantized_model(tmp_path / "q", "qwen3", intermediate_size=128,
                                 hidden_size=128, head_dim=32)  # fmt: skip
    expected = mlx_lm_greedy(load(str(path))[0], PROMPTS, MAX_TOKENS)
    llm = LLM(str(path), num_blocks=64, block_size=4, lean_decode="fused")
    assert [r.token_ids for r in llm.generate(PROMPTS, PARAMS)] == expected


def test_qwen3_layers_carry_their_query_and_key_norms(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3")), num_blocks=32, block_size=4, lean_decode="fused")
    layer = llm.engine.runner.lean.layers[0]
    attn = layer.block.self_attn
    assert layer.norms == (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
    assert layer.gate_up is not None and layer.inv_freq.shape == (layer.heads[2] // 2,)


def test_rows_joining_leaving_and_preempted_keep_mlx_lms_tokens(tiny_model_dir):
    """A pool too small for every row at once: rows are preempted and recomputed, and rows of
    several lengths join and leave the decode batch."""
    path = str(tiny_model_dir("llama"))
    prompts = [list(range(3, 3 + n)) for n in (5, 30, 12, 41, 2)]
    lengths = [8, 24, 16, 20, 30]
    expected = [mlx_lm_greedy(load(path)[0], [p], n)[0] for p, n in zip(prompts, lengths)]
    llm = LLM(path, num_blocks=24, block_size=4, max_num_seqs=4, lean_decode="fused")
    got = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths])
    assert [r.token_ids for r in got] == expected
    assert llm.engine.metrics.preemptions_total > 0


@pytest.mark.parametrize("lean", ["on", "fused"])
def test_prefill_chunks_riding_in_decode_forwards_take_the_lean_step(tiny_model_dir, lean):
    """A long prompt prefilled in chunks inside decode forwards (each chunk token a row of one
    token): those forwards run the lean step too, and the tokens stay mlx-lm's."""
    path = str(tiny_model_dir("qwen3"))
    prompts = [list(range(5, 12)), list(range(20, 90))]
    expected = mlx_lm_greedy(load(path)[0], prompts, MAX_TOKENS)
    llm = LLM(path, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=9,
              prefill_step_size=16, lean_decode=lean)  # fmt: skip
    runner, steps = llm.engine.runner, []
    lean_step = runner.lean

    def counted(tokens, caches):
        steps.append(caches[0].metadata.decode_rows is not None)
        return lean_step(tokens, caches)

    runner.lean = counted
    assert [r.token_ids for r in llm.generate(prompts, PARAMS)] == expected
    assert any(steps), "no prefill chunk rode in a decode forward"


def test_windowed_layers_keep_their_windows(tmp_path):
    path = str(build_model(tmp_path / "w", "llama", sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"]))  # fmt: skip
    llm = LLM(path, num_blocks=64, block_size=4, lean_decode="fused")
    assert llm.engine.runner.lean.windows == [8, None]
    got = llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [r.token_ids for r in got] == mlx_lm_greedy(load(path)[0], PROMPTS, 24)


def test_quantized_pages_take_the_fused_rows(tmp_path):
    """8-bit pages: the fused step's rows are quantized on the way as the lean step's are."""
    path = str(build_model(tmp_path / "q", "llama", head_dim=32, hidden_size=128))
    on = LLM(path, num_blocks=64, block_size=4, kv_bits=8, kv_group_size=32)
    fused = LLM(path, num_blocks=64, block_size=4, kv_bits=8, kv_group_size=32,
                lean_decode="fused")  # fmt: skip
    want = [r.token_ids for r in on.generate(PROMPTS, PARAMS)]
    assert [r.token_ids for r in fused.generate(PROMPTS, PARAMS)] == want


@pytest.mark.parametrize(
    "model_type,why",
    [("gemma3_text", "covers llama"), ("ministral3", "covers llama"),
     ("deepseek_v3", "covers llama"), ("gemma2", "lean forward covers")],
)  # fmt: skip
def test_models_it_cannot_serve_are_refused_at_load(tiny_model_dir, model_type, why):
    with pytest.raises(ValueError, match=f"--lean-decode fused.*{why}"):
        LLM(str(tiny_model_dir(model_type)), num_blocks=32, lean_decode="fused")


def test_fused_rope_on_is_refused_beside_it(tiny_model_dir):
    with pytest.raises(ValueError, match="--fused-rope off"):
        LLM(str(tiny_model_dir("llama")), num_blocks=32, lean_decode="fused", fused_rope="on")


@pytest.mark.parametrize(
    "model_type,fused_rope,step",
    [("llama", "off", FusedDecode), ("llama", "on", LeanDecode),
     ("gemma3_text", "off", LeanDecode), ("deepseek_v3", "off", LeanDecode)],
)  # fmt: skip
def test_auto_fuses_where_the_blocks_allow_and_stays_lean_elsewhere(
    tiny_model_dir, model_type, fused_rope, step
):
    path = str(tiny_model_dir(model_type))
    llm = LLM(path, num_blocks=64, block_size=4, lean_decode="auto", fused_rope=fused_rope)
    assert type(llm.engine.runner.lean) is step
    got = llm.generate(PROMPTS[:2], PARAMS)
    assert [r.token_ids for r in got] == mlx_lm_greedy(load(path)[0], PROMPTS[:2], MAX_TOKENS)
