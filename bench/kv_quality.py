"""`mlx-paged bench kv-quality`: what quantized K/V pages cost in quality.

The model reads a held-out text (the Python language reference topics that ship with CPython,
`pydoc_data.topics`, in key order) in chunks through the paged path, once per setting, in
lockstep: every chunk after the first attends over the pages the earlier chunks wrote, quantized
on write where the setting says, as chunked prefill and decode do. Against 16-bit pages it
reports the text's perplexity, the mean KL divergence of the next-token distributions, and how
often the greedy next token agrees; then each setting generates greedily from the text's start
through the engine, and the tokens are compared with 16-bit's.
"""

from __future__ import annotations

import math

import mlx.core as mx

from mlx_paged.progress import progress

from .output import device_name, write_result

SETTINGS = {"16-bit": (16, 16), "8-bit": (8, 8), "4-bit": (4, 4), "K8 / V4": (8, 4)}
BLOCK_SIZE = 16


def corpus(tokenizer, num_tokens: int) -> list[int]:
    """The first `num_tokens` tokens of the held-out text."""
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[key] for key in sorted(topics.topics))
    tokens = tokenizer.encode(text)
    if len(tokens) < num_tokens:
        raise ValueError(f"the text has {len(tokens)} tokens, fewer than {num_tokens}")
    return list(tokens[:num_tokens])


def _pools(layout, settings: dict, group_size: int, num_tokens: int) -> dict:
    from mlx_paged.kv.kv_cache_manager import cdiv
    from mlx_paged.kv.paged_cache import PagedKVPool

    blocks = cdiv(num_tokens, BLOCK_SIZE) + 1  # block 0 is the null block
    return {
        name: PagedKVPool(layout.num_layers, blocks, BLOCK_SIZE, layout.num_kv_heads,
                          layout.head_dim, layout.dtype, k, v, group_size)
        for name, (k, v) in settings.items()
    }  # fmt: skip


def _chunk_logprobs(model, pool, tokens: list[int], start: int, n: int) -> mx.array:
    """float32 log-probabilities `(n, V)` of the chunk `tokens[start:start + n]`, over the
    pages of every token before it (pages 1, 2, ... in order)."""
    from mlx_paged.kernels.kernel_inputs import input_array
    from mlx_paged.kv.kv_cache_manager import cdiv
    from mlx_paged.kv.page_arrays import make_slot_mapping
    from mlx_paged.kv.paged_cache import PagedAttentionMetadata, PagedLayerCache

    table = list(range(1, cdiv(start + n, BLOCK_SIZE) + 1))
    slots = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, start + n)]
    meta = PagedAttentionMetadata(
        block_tables=input_array([table]), context_lens=input_array([start + n]),
        offsets=input_array([start]), slot_mapping=make_slot_mapping(slots),
        num_query_tokens=n, prefill_rows=((start, n, input_array(table)),),
    )  # fmt: skip
    caches = [PagedLayerCache(pool, i, meta) for i in range(pool.num_layers)]
    logits = model(mx.array([tokens[start : start + n]]), cache=caches)[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def teacher_forced(model, layout, tokens: list[int], chunk: int, group_size: int) -> dict:
    """Per setting: perplexity, and against 16-bit the mean KL and the top-1 agreement."""
    pools = _pools(layout, SETTINGS, group_size, len(tokens))
    sums = {name: {"nll": 0.0, "kl": 0.0, "agree": 0} for name in SETTINGS}
    scored = 0
    starts = range(0, len(tokens) - 1, chunk)
    for start in progress(starts, f"scoring {len(tokens) - 1} tokens", unit="chunk"):
        n = min(chunk, len(tokens) - 1 - start)
        targets = mx.array(tokens[start + 1 : start + n + 1])
        reference = None
        for name in SETTINGS:
            lp = _chunk_logprobs(model, pools[name], tokens, start, n)
            reference = lp if reference is None else reference
            kl = (mx.exp(reference) * (reference - lp)).sum(-1).sum()
            agree = (lp.argmax(-1) == reference.argmax(-1)).sum()
            nll = -mx.take_along_axis(lp, targets[:, None], axis=-1).sum()
            s = sums[name]
            s["nll"] += nll.item()
            s["kl"] += kl.item()
            s["agree"] += agree.item()
        scored += n
    return {
        name: {"perplexity": math.exp(s["nll"] / scored), "mean_kl": s["kl"] / scored,
               "top1_agreement": s["agree"] / scored}
        for name, s in sums.items()
    }  # fmt: skip


def greedy_agreement(model_path: str | None, prompt: list[int], new: int, group_size: int) -> dict:
    """Per setting: greedy tokens from `prompt` through the engine, against 16-bit's."""
    from mlx_paged import LLM, SamplingParams

    params = SamplingParams(max_tokens=new, ignore_eos=True)
    out, reference = {}, None
    for name, (k, v) in progress(SETTINGS.items(), "greedy runs", unit="setting"):
        llm = LLM(model_path, kv_bits_k=k, kv_bits_v=v, kv_group_size=group_size,
                  enable_prefix_caching=False, max_num_seqs=1)  # fmt: skip
        tokens = llm.generate([prompt], params)[0].token_ids
        reference = tokens if reference is None else reference
        same = [a == b for a, b in zip(tokens, reference)]
        out[name] = {"first_difference": same.index(False) if False in same else len(same),
                     "agreement": sum(same) / len(same)}  # fmt: skip
        llm.engine.shutdown()
    return out


def main(args) -> int:
    from mlx_paged.models.loader import load_model
    from mlx_paged.runner.paged_setup import paged_layout

    model, tokenizer, model_id, _ = load_model(args.model, None)
    layout = paged_layout(model)
    tokens = corpus(tokenizer, args.tokens)
    print(f"{model_id}: {args.tokens} tokens in chunks of {args.chunk}, groups of "
          f"{args.group_size}", flush=True)  # fmt: skip
    forced = teacher_forced(model, layout, tokens, args.chunk, args.group_size)
    greedy = greedy_agreement(args.model, tokens[: args.prompt], args.new, args.group_size)
    base = forced["16-bit"]["perplexity"]
    rows = {name: {**forced[name], "perplexity_change": forced[name]["perplexity"] / base - 1,
                   "greedy": greedy[name]} for name in SETTINGS}  # fmt: skip
    print(f"{'pages':8s} {'perplexity':>10s} {'change':>8s} {'mean KL':>9s} {'top-1 agree':>11s} "
          f"{'greedy same':>11s}")  # fmt: skip
    for name, r in rows.items():
        print(f"{name:8s} {r['perplexity']:10.4f} {100 * r['perplexity_change']:+7.2f}% "
              f"{r['mean_kl']:9.5f} {100 * r['top1_agreement']:10.1f}% "
              f"{r['greedy']['first_difference']:>5d}/{args.new}")  # fmt: skip
    result = {"model": model_id, "device": device_name(), "mlx": mx.__version__,
              "tokens": args.tokens, "chunk": args.chunk, "group_size": args.group_size,
              "prompt_tokens": args.prompt, "new_tokens": args.new,
              "text": "pydoc_data.topics (CPython), topics in key order",
              "settings": rows}  # fmt: skip
    write_result(result, args.out)
    return 0
