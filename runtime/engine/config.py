"""Engine configuration, shared by the CLI, the server and the `LLM` API."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_paged.kernels.quantized_pages import KV_BITS, KV_GROUP_SIZES

PAGED_ATTENTION_MODES = ("auto", "kernel", "reference")
AUTO_ON_OFF = ("auto", "on", "off")
LEAN_DECODE_MODES = ("auto", "on", "fused", "off")


@dataclass(slots=True)
class EngineConfig:
    """Knobs of the engine; names follow mlx_lm.server's flags where one exists.

    Attributes:
        kv_paged: the paged KV path instead of the contiguous (mlx-lm-exact) one.
        max_num_seqs: most requests decoding at once (`--decode-concurrency`).
        max_num_prefill_seqs: most requests prefilling at once (`--prompt-concurrency`).
        prefill_step_size: prompt tokens per request per step (`--prefill-step-size`).
        max_num_batched_tokens: most tokens a step runs while requests decode, decode rows
            included, so prompts are prefilled in chunks between decode steps
            (`--max-num-batched-tokens`, vLLM's name; paged path only); None: no budget.
            A step with no request decoding runs every prefilling request's full chunk.
        max_model_len: longest prompt + output; None takes the model's own context length.
        block_size, kv_budget_bytes, num_blocks, enable_prefix_caching: the paged KV pool.
        paged_attention: decode attention over pages: "auto" (the generated kernel on a Metal
            or CUDA GPU, the reference elsewhere), "kernel" (fail at load without one) or
            "reference" (gather pages + SDPA everywhere).
        compile_decode: replay paged decode steps from `mx.compile` traces: "auto" (with the
            generated GPU kernels), "on" or "off".
        fused_rope: decode steps apply RoPE inside the attention kernel: "auto" (with the
            generated kernels, for models whose RoPE they express), "on" (also on the
            reference path; fail at load if the model does not qualify) or "off".
        lean_decode: decode steps of llama-family models run `LeanDecode` (fewer graph nodes
            than mlx-lm's forward: "on"), `FusedDecode` (fewer again: each layer's small ops
            in the generated layer kernels, "fused"; refused at load where the blocks do not
            allow it), the fused step where the blocks allow it and the lean one elsewhere
            ("auto", the default), or mlx-lm's forward ("off").
        prefill_chunk_seconds: how long a step with prompt work may take (paged path): prompt
            chunks are sized from measured step times and shared equally among prompts, so
            a long prompt cannot hold a short one's first token, or a hang-up, for its whole
            prefill (`--prefill-chunk-seconds`); None turns it off.
        prefill_itl_ratio: while streams decode, a step with prompt work may also take at most
            this many times a decode-only step (`MixedStepCap`), so that prompts arriving
            together cannot stretch every stream's next token (`--prefill-itl-ratio`); None:
            only `prefill_chunk_seconds` applies.
        kv_bits: bits per K and V value in the pages (`--kv-bits`): 16 (the model's dtype),
            8 or 4 (quantized in groups of `kv_group_size`, paged path only); `kv_bits_k` /
            `kv_bits_v` set keys and values apart.
        kv_groups: sliding-window layers in KV cache groups of their own, which free the
            blocks their window left (paged path); False keeps every layer in one group.
        draft_model: speculative decoding's drafter (`--draft-model`, paged path): "ngram"
            (prompt lookup over each request's own tokens) or a smaller model sharing the
            tokenizer (a folder or hub name); None turns it off.
        num_draft_tokens: most tokens a draft holds (`--num-draft-tokens`).
        step_log: a file to append a JSON line to for every step (`engine/step_log.py`,
            `--step-log`); None writes none.
    """

    kv_paged: bool = True
    max_num_seqs: int = 32
    max_num_prefill_seqs: int = 8
    prefill_step_size: int = 2048
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    kv_budget_bytes: int | None = None
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    paged_attention: str = "auto"
    compile_decode: str = "auto"
    fused_rope: str = "off"
    lean_decode: str = "auto"
    kv_bits: int = 16
    kv_bits_k: int | None = None
    kv_bits_v: int | None = None
    kv_group_size: int = 64
    prefill_chunk_seconds: float | None = 0.5
    prefill_itl_ratio: float | None = None
    kv_groups: bool = True
    draft_model: str | None = None
    num_draft_tokens: int = 4
    step_log: str | None = None

    @property
    def step_token_ceiling(self) -> int:
        """A step's most tokens: every prefilling request's whole chunk, and the decode rows."""
        return self.max_num_prefill_seqs * self.prefill_step_size + self.max_num_seqs

    @property
    def k_bits(self) -> int:
        return self.kv_bits if self.kv_bits_k is None else self.kv_bits_k

    @property
    def v_bits(self) -> int:
        return self.kv_bits if self.kv_bits_v is None else self.kv_bits_v

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_prefill_seqs", "prefill_step_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name, allowed in (
            ("paged_attention", PAGED_ATTENTION_MODES),
            ("compile_decode", AUTO_ON_OFF),
            ("fused_rope", AUTO_ON_OFF),
            ("lean_decode", LEAN_DECODE_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.prefill_itl_ratio is not None and self.prefill_itl_ratio <= 1:
            raise ValueError(
                f"prefill_itl_ratio must exceed 1 (a step with prompt work outlasts a decode "
                f"step), got {self.prefill_itl_ratio}"
            )
        if self.max_num_batched_tokens is not None and not self.kv_paged:
            raise ValueError(
                "max_num_batched_tokens needs the paged KV path: the contiguous path prefills "
                "as mlx-lm's BatchGenerator does, to give its exact tokens"
            )
        self._check_kv_bits()
        self._check_speculation()
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")

    def _check_speculation(self) -> None:
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.draft_model is None:
            return
        if not self.kv_paged:
            raise ValueError(
                "speculative decoding needs the paged KV path: the contiguous path is mlx-lm's "
                "BatchGenerator, one token per row a step"
            )

    def _check_kv_bits(self) -> None:
        for name in ("kv_bits", "kv_bits_k", "kv_bits_v"):
            value = getattr(self, name)
            if value is not None and value not in KV_BITS:
                raise ValueError(f"{name} must be one of 16, 8, 4, got {value!r}")
        if self.kv_group_size not in KV_GROUP_SIZES:
            raise ValueError(f"kv_group_size must be 32 or 64, got {self.kv_group_size!r}")
        if min(self.k_bits, self.v_bits) < 16 and not self.kv_paged:
            raise ValueError(
                "quantized K/V (kv bits below 16) needs the paged KV path: the contiguous path "
                "runs mlx-lm's batch caches, which cannot be quantized (BatchKVCache has no "
                "to_quantized); drop --kv-paged off / kv_paged=False to quantize pages"
            )
