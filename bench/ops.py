"""MLX primitives a decode step builds (`mlx-paged bench ops`), next to mlx-lm's forward.

MLX's host time per primitive (6-7 µs on the H200, whatever the primitive does) makes the op
count of a decode step its floor, so this counts the nodes of one step's graph before MLX runs
it: the engine's paged decode step (forward, sampling and the page writes it evaluates), and
mlx-lm's own forward of one token over its `KVCache` with a greedy pick, counted the same way.
Per layer: the difference between the same random model at 2 and 4 layers, halved, so what
runs once a step (embedding, final norm, head, sampling) stays out of it.

Counts are of the graph as a GPU builds it, on any machine: the step is traced with the
decode kernels' backend named (`mx.export_function` lets a CPU build their nodes), so each
generated kernel is one node, and each `mx.fast` op (RMSNorm, RoPE, SDPA), which the CPU builds
from its fallback ops, counts as the one node it is on a GPU (`FastOpsAsOne`). The count is
before `mx.compile`'s fusion of elementwise chains, which a GPU's compiled steps add.
"""

from __future__ import annotations

import collections
import json
import re
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from mlx_paged.kernels.paged_attention import current_backend
from mlx_paged.models.lean_fused import FUSED_FAMILIES

from .random_models import build_random_llama

SMALL = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
# Per family, what its random model needs beyond `SMALL` (deepseek_v3: latent attention).
FAMILIES = {
    "llama": {},
    "qwen3": {},
    "deepseek_v3": {"kv_lora_rank": 128, "q_lora_rank": 64, "qk_rope_head_dim": 32,
                    "qk_nope_head_dim": 32, "v_head_dim": 32},
}  # fmt: skip
LAYERS = (2, 4)
PROMPT = list(range(3, 40))


def count_nodes(*arrays) -> collections.Counter:
    """The primitives of the graph that produces `arrays` (unevaluated), by name."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.dot"
        mx.export_to_dot(str(path), *arrays)
        text = path.read_text()
    return collections.Counter(re.findall(r'label ="?([A-Za-z_]+)"?, shape=rectangle', text))


class FastOpsAsOne:
    """While active, each `mx.fast` call records the nodes its fallback builds here (built again
    on zeros of its inputs' shapes) in `fallback`, and itself in `calls`: a GPU's graph has
    the total less `fallback`, plus `calls`."""

    NAMES = ("rms_norm", "layer_norm", "rope", "scaled_dot_product_attention")

    def __init__(self):
        self.fallback = collections.Counter()
        self.calls = collections.Counter()
        self._saved = {}

    def __enter__(self):
        for name in self.NAMES:
            self._saved[name] = original = getattr(mx.fast, name)
            setattr(mx.fast, name, self._counted(name, original))
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(mx.fast, name, original)

    def _counted(self, name: str, original):
        def call(*args, **kwargs):
            def zeros(x):
                return mx.zeros(x.shape, x.dtype) if isinstance(x, mx.array) else x

            args0, kwargs0 = [zeros(a) for a in args], {k: zeros(v) for k, v in kwargs.items()}
            inputs = [x for x in [*args0, *kwargs0.values()] if isinstance(x, mx.array)]
            self.fallback += count_nodes(original(*args0, **kwargs0)) - count_nodes(*inputs)
            self.calls[f"fast.{name}"] += 1
            return original(*args, **kwargs)

        return call


def traced_nodes(step, inputs: mx.array) -> collections.Counter:
    """The nodes of the arrays `step(inputs)` returns, traced by `mx.export_function` (where a
    CPU builds generated kernels' nodes), each `mx.fast` op one node."""
    found = {}

    def traced(x):
        with FastOpsAsOne() as fast:
            outputs = step(x)
            nodes = count_nodes(*outputs)
        nodes.subtract(fast.fallback)
        found["nodes"] = +(nodes + fast.calls)
        return outputs[0]

    with tempfile.TemporaryDirectory() as tmp:
        mx.export_function(str(Path(tmp) / "step.mlxfn"), traced, inputs)
    return found["nodes"]


def paged_step_nodes(model_dir: Path, backend: str, lean_decode: str = "on") -> collections.Counter:
    """One decode step of one row, as the engine builds it on `backend`'s kernels with
    `lean_decode`, after the prompt and two steps."""
    from mlx_paged import LLM, SamplingParams
    from mlx_paged.sampling.sampler import sample

    llm = LLM(str(model_dir), num_blocks=64, block_size=16, compile_decode="off",
              lean_decode=lean_decode)  # fmt: skip
    engine = llm.engine
    engine.add_request(PROMPT, SamplingParams(max_tokens=64, ignore_eos=True))
    engine.drain_inbox()
    runner = engine.runner
    # The prompt enters in as many steps as the pacer allows (fewer where it has measured
    # steps, as on a GPU after warm-up); then two decode steps.
    for _ in range(len(PROMPT)):
        if runner.decode_rows:
            break
        engine.step()
    for _ in range(2):
        engine.step()
    runner.pool.decode_backend = backend
    samplings = [r.runtime.sampling for r in runner.decode_rows]

    def step(inputs):
        tokens, _, _ = sample(runner._verify_logits(inputs), inputs, samplings)
        written = runner._written()
        return [tokens, *(x for p in written[0] for x in p), *written[1]]

    inputs = runner.next_tokens
    if inputs is None:  # a lone row's tokens go out as they come (the engine's `emit_pending`)
        inputs = mx.array([r.last_token_id for r in runner.decode_rows], mx.uint32)
    nodes = traced_nodes(step, inputs)
    engine.shutdown()
    return nodes


def mlx_lm_step_nodes(model_dir: Path) -> collections.Counter:
    """mlx-lm's forward of one token after the prompt, with a greedy pick and its cache."""
    model, _ = load(str(model_dir))
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([PROMPT]), cache=cache))

    def step(token):
        logits = model(token[None], cache=cache)
        kv = (x for c in cache for x in (c.keys, c.values))
        return [mx.argmax(logits[:, -1, :], axis=-1), *kv]

    return traced_nodes(step, mx.array([PROMPT[-1]]))


def family_ops(family: str, backend: str) -> dict:
    """Per-step and per-layer node counts of `family`'s random model: the default decode
    step's, `--lean-decode fused`'s where the family has it (`fused_*`), and mlx-lm's."""
    steps, fused, mlx_lm = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for layers in LAYERS:
            folder = Path(tmp) / f"{family}-{layers}"
            config = {**SMALL, **FAMILIES[family], "num_hidden_layers": layers}
            build_random_llama(folder, config, model_type=family)
            steps[layers] = paged_step_nodes(folder, backend)
            if family in FUSED_FAMILIES:
                fused[layers] = paged_step_nodes(folder, backend, "fused")
            mlx_lm[layers] = mlx_lm_step_nodes(folder)
    counts = {**_per_layer(steps), **{f"mlx_lm_{k}": v for k, v in _per_layer(mlx_lm).items()}}
    if fused:
        counts |= {f"fused_{k}": v for k, v in _per_layer(fused).items()}
    return {"num_layers": LAYERS[1], **counts}


def _per_layer(steps: dict) -> dict:
    """`ops_per_step` of the larger model, and per layer: the difference of the two models
    over their difference in layers, in all and by primitive."""
    few, many = LAYERS
    per_layer = _difference(steps[many], steps[few])
    return {
        "ops_per_step": sum(steps[many].values()),
        "ops_per_layer": sum(per_layer.values()) / (many - few),
        "per_layer_by_primitive": {k: v / (many - few) for k, v in per_layer.most_common()},
    }


def _difference(more: collections.Counter, fewer: collections.Counter) -> collections.Counter:
    """`more - fewer`, keeping negative counts (a primitive a smaller model has more of)."""
    out = collections.Counter(more)
    out.subtract(fewer)
    return collections.Counter({k: v for k, v in out.items() if v})


def main(args) -> int:
    backend = current_backend() or "metal"  # the kernels' nodes, traced even on a CPU
    results = {f: family_ops(f, backend) for f in args.family}
    for family, r in results.items():
        print(f"{family}: {r['ops_per_step']} ops a step ({r['num_layers']} layers), "
              f"{r['ops_per_layer']:g} a layer; mlx-lm {r['mlx_lm_ops_per_step']} a step, "
              f"{r['mlx_lm_ops_per_layer']:g} a layer")  # fmt: skip
        if "fused_ops_per_layer" in r:
            print(f"  --lean-decode fused: {r['fused_ops_per_step']} a step, "
                  f"{r['fused_ops_per_layer']:g} a layer")  # fmt: skip
        print("  a layer: " + ", ".join(f"{k} {v:g}" for k, v in
                                        r["per_layer_by_primitive"].items()))  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {"kernels_backend": backend, "mlx": mx.__version__, "counted": "graph nodes of one "
            "decode step before mx.compile fusion; each mx.fast op and each kernel one node",
            "model": SMALL, "layers_compared": list(LAYERS), "results": results}  # fmt: skip
    out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {out}")
    return 0
