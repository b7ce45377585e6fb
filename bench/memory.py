"""KV memory density: how many sequences fit a fixed KV budget, and how much allocated KV memory
holds no token, for the paged path, the contiguous (left-padded) path and mlx-lm's
BatchGenerator, on one seeded workload, measured by running each of them.

Workload (seeded): prompt lengths log-normal (median 192 tokens, sigma 0.8, clipped to
[16, 1536]); output lengths uniform in [32, 384]; EOS ignored, so every request produces its
full output. The model is a small random-weight llama built offline (its weights do not change
memory behaviour; its KV layout is 2 layers x 4 KV heads x 64 dims, bfloat16).

Paged: the pool is the budget and the scheduler admits and preempts against it, so its
concurrency is measured directly. The contiguous path and BatchGenerator have no KV budget; they
run with a fixed decode batch cap, and the table reports how many of their sequences the budget
holds at the allocation they were measured to need per running sequence.

With `--kv-bits 16 8 4`, the paged path also runs with quantized pages (groups of 64) at the
same budget in bytes, so the sequences they hold are measured the same way.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from mlx_paged.progress import Progress

CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "vocab_size": 512,
}
KV_GROUP_SIZE = 64


def build_model(out: Path) -> Path:
    """A random llama with a byte-level tokenizer, written as an mlx-lm folder."""
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["memory density benchmark"] * 10,
        trainer=trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|eos|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>").save_pretrained(str(out))
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    model.set_dtype(mx.bfloat16)
    save_model(out, model)
    save_config({**CONFIG, "eos_token_id": 0}, config_path=out / "config.json")
    return out


def kv_bytes_per_token(kv_bits: int = 16) -> int:
    """KV bytes one token of the benchmark model takes, K and V of every layer."""
    from mlx_paged.kernels.quantized_pages import layer_bytes_per_token as layer_bytes

    heads, dim = CONFIG["num_key_value_heads"], CONFIG["head_dim"]
    per_layer = layer_bytes(heads, dim, mx.bfloat16, kv_bits, kv_bits, KV_GROUP_SIZE)
    return CONFIG["num_hidden_layers"] * per_layer


def workload(n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt_len = min(max(int(rng.lognormvariate(5.26, 0.8)), 16), 1536)
        out.append(([rng.randrange(1, 300) for _ in range(prompt_len)], rng.randint(32, 384)))
    return out


@dataclass
class Trace:
    """Per-step samples of running sequences, allocated and used KV bytes."""

    running: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    # running counts of the steps where requests waited for KV: there the budget binds
    bound: list[int] = field(default_factory=list)

    def add(self, running: int, allocated: int, used: int, waiting: int = 0) -> None:
        if running:
            self.running.append(running)
            self.allocated.append(allocated)
            self.used.append(used)
            if waiting:
                self.bound.append(running)

    def summary(self, budget: int, enforced: bool) -> dict:
        waste = 1 - sum(self.used) / max(sum(self.allocated), 1)
        per_seq = sum(self.allocated) / max(sum(self.running), 1)
        at_budget = statistics.mean(self.bound or self.running) if enforced else budget / per_seq
        return {
            "mean_running": statistics.mean(self.running),
            "peak_running": max(self.running),
            "peak_allocated_bytes": max(self.allocated),
            "waste_fraction": waste,
            "allocated_bytes_per_running_seq": per_seq,
            "sequences_at_budget": at_budget,
            "budget_bound_steps": len(self.bound),
            "budget_enforced": enforced,
            "steps": len(self.running),
        }


def run_paged(model_dir, jobs, budget, block_size, kv_bits: int = 16) -> Trace:
    from mlx_paged import LLM, SamplingParams

    bytes_per_token = kv_bytes_per_token(kv_bits)
    block_bytes = block_size * bytes_per_token
    llm = LLM(
        str(model_dir),
        kv_paged=True,
        block_size=block_size,
        num_blocks=budget // block_bytes + 1,
        max_num_seqs=256,
        max_num_prefill_seqs=8,
        kv_bits=kv_bits,
        kv_group_size=KV_GROUP_SIZE,
    )
    engine, trace = llm.engine, Trace()
    for prompt, n in jobs:
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    engine.drain_inbox()
    pool = engine.kv.block_pool
    for _ in _steps(engine, jobs, f"paged path, {kv_bits}-bit pages"):
        live = engine.scheduler.running + engine.scheduler.prefilling
        used = sum(r.num_computed_tokens for r in live) * bytes_per_token
        trace.add(
            len(engine.scheduler.running),
            (pool.num_usable_blocks - pool.num_free_blocks) * block_bytes,
            used,
            len(engine.scheduler.waiting),
        )
    return trace


def run_contiguous(model_dir, jobs, cap, bytes_per_token) -> Trace:
    from mlx_paged import LLM, SamplingParams

    llm = LLM(str(model_dir), kv_paged=False, max_num_seqs=cap, max_num_prefill_seqs=min(cap, 8))
    engine, trace = llm.engine, Trace()
    for prompt, n in jobs:
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    engine.drain_inbox()
    for _ in _steps(engine, jobs, "contiguous path"):
        live = engine.scheduler.running + engine.scheduler.prefilling
        used = sum(r.num_computed_tokens + len(r.output_token_ids) for r in live)
        trace.add(
            len(engine.scheduler.running), engine.runner.kv_bytes_in_use, used * bytes_per_token
        )
    return trace


def run_batch_generator(model_dir, jobs, cap, bytes_per_token) -> Trace:
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    model, _ = load(str(model_dir))
    gen = BatchGenerator(
        model,
        max_tokens=512,
        stop_tokens=None,
        completion_batch_size=cap,
        prefill_batch_size=min(cap, 8),
    )
    gen.insert([p for p, _ in jobs], max_tokens=[n for _, n in jobs])
    trace = Trace()
    bar = Progress("mlx-lm BatchGenerator", sum(n for _, n in jobs), "tok")
    while True:
        prompt_responses, responses = gen.next()
        if not prompt_responses and not responses:
            break
        bar.update(len(responses))
        batches = (gen._generation_batch, gen._prompt_batch)
        used = sum(len(t) for b in batches for t in b.tokens)
        trace.add(len(gen._generation_batch), gen.prompt_cache_nbytes, used * bytes_per_token)
    gen.close()
    bar.close()
    return trace


def _steps(engine, jobs, desc: str):
    """Step `engine` until its requests are done, yielding after each step, with progress in
    tokens computed (prompt and generated)."""
    m = engine.metrics
    with Progress(desc, sum(len(p) + n for p, n in jobs), "tok") as bar:
        while engine.scheduler.has_unfinished_requests():
            before = m.prompt_tokens_total + m.generation_tokens_total
            engine.step()
            bar.update(m.prompt_tokens_total + m.generation_tokens_total - before)
            yield


def main(args) -> int:
    bytes_per_token = kv_bytes_per_token()
    budget = args.budget_tokens * bytes_per_token
    jobs = workload(args.requests, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp))
        results = {
            ("paged" if bits == 16 else f"paged_kv{bits}"): run_paged(
                model_dir, jobs, budget, args.block_size, bits
            ).summary(budget, True)
            for bits in sorted(set(args.kv_bits) | {16}, reverse=True)
        }
        results["contiguous"] = run_contiguous(model_dir, jobs, args.cap, bytes_per_token).summary(
            budget, False
        )
        results["mlx_lm_batch_generator"] = run_batch_generator(
            model_dir, jobs, args.cap, bytes_per_token
        ).summary(budget, False)
    print(
        f"KV budget {budget / 2**20:.1f} MiB ({args.budget_tokens} tokens), {args.requests} "
        f"requests, seed {args.seed}, block size {args.block_size}, cap {args.cap}"
    )
    print(
        f"{'path':24s} {'seqs at budget':>15s} {'mean running':>13s} {'peak running':>13s} "
        f"{'KV waste':>9s}"
    )
    for name, r in results.items():
        print(
            f"{name:24s} {r['sequences_at_budget']:15.1f} {r['mean_running']:13.1f} "
            f"{r['peak_running']:13d} {100 * r['waste_fraction']:8.1f}%"
        )
    base = results["paged"]["sequences_at_budget"]
    for bits in args.kv_bits:
        if bits != 16:
            seqs = results[f"paged_kv{bits}"]["sequences_at_budget"]
            print(f"{bits}-bit pages: {seqs / base:.2f}x the sequences of 16-bit pages")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "budget_bytes": budget,
                "budget_tokens": args.budget_tokens,
                "requests": args.requests,
                "seed": args.seed,
                "block_size": args.block_size,
                "cap": args.cap,
                "kv_group_size": KV_GROUP_SIZE,
                "workload": "prompt ~ lognormal(median 192, sigma 0.8) in [16, 1536]; "
                "output ~ uniform[32, 384]; EOS ignored",
                "model": CONFIG,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0
