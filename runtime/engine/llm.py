"""Offline batched generation: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from mlx_paged.engine.config import EngineConfig
from mlx_paged.engine.core import Engine
from mlx_paged.engine.outputs import TokenLogprob
from mlx_paged.models.loader import load_model
from mlx_paged.sampling.sampling_params import SamplingParams

Prompt = str | Sequence[int]


@dataclass(slots=True)
class CompletionResult:
    """The whole output of one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


class LLM:
    """Load a model once and generate for batches of prompts, continuously batched.

    Args:
        model: an mlx-lm folder or hub name; None is the embedded SmolLM2-135M-Instruct.
        kv_paged: the paged KV path (default); False is the contiguous path, token-exact with
            mlx-lm's BatchGenerator.
        paged_attention: "auto", "kernel" or "reference" decode attention over pages.
        compile_decode: "auto", "on" or "off": replay decode steps from `mx.compile` traces.
        fused_rope: "auto", "on" or "off": RoPE inside the decode attention kernel.
        kv_bits: bits per K/V value in the pages: 16, 8 or 4 (quantized in groups of
            `kv_group_size`, 32 or 64; paged path only); `kv_bits_k` / `kv_bits_v` set keys and
            values apart (e.g. 8 and 4).
        block_size, num_blocks, kv_budget_bytes, enable_prefix_caching: the paged KV pool
            (`num_blocks` wins over `kv_budget_bytes`; neither: 10% of device memory).
        max_num_seqs: most sequences decoding at once.
        max_num_prefill_seqs: most sequences prefilling at once.
        prefill_step_size: prompt tokens per sequence per step.
        max_num_batched_tokens: most tokens a step runs while sequences decode, decode rows
            included (paged path; None: no budget).
        chat_template: replaces the tokenizer's chat template.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        kv_paged: bool = True,
        max_num_seqs: int = 32,
        max_num_prefill_seqs: int = 8,
        prefill_step_size: int = 2048,
        max_num_batched_tokens: int | None = None,
        chat_template: str | None = None,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_budget_bytes: int | None = None,
        enable_prefix_caching: bool = True,
        paged_attention: str = "auto",
        compile_decode: str = "auto",
        fused_rope: str = "off",
        kv_bits: int = 16,
        kv_bits_k: int | None = None,
        kv_bits_v: int | None = None,
        kv_group_size: int = 64,
    ):
        config = EngineConfig(
            kv_paged=kv_paged,
            max_num_seqs=max_num_seqs,
            max_num_prefill_seqs=max_num_prefill_seqs,
            prefill_step_size=prefill_step_size,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_budget_bytes=kv_budget_bytes,
            enable_prefix_caching=enable_prefix_caching,
            paged_attention=paged_attention,
            compile_decode=compile_decode,
            fused_rope=fused_rope,
            kv_bits=kv_bits,
            kv_bits_k=kv_bits_k,
            kv_bits_v=kv_bits_v,
            kv_group_size=kv_group_size,
        )
        self.model, self.tokenizer, self.model_id, model_config = load_model(model, chat_template)
        self.engine = Engine(self.model, self.tokenizer, config, model_config)

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt given as text or ids (text is encoded without a chat template)."""
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        return list(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionResult]:
        """Generate for every prompt; returns one result per prompt, in order.

        Args:
            prompts: a prompt or a list of prompts (text or token ids).
            params: one `SamplingParams` for all prompts, or one per prompt; default greedy.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        streams = []
        for prompt, p in zip(prompts, params):
            ids = self.encode(prompt)
            p = dataclasses.replace(p)  # one copy per request: check_request may shorten it
            self.engine.check_request(ids, p)
            streams.append(self.engine.add_request(ids, p))
        results = {
            s.request_id: CompletionResult(
                s.request_id, list(s.request.prompt_token_ids), [], "", None
            )
            for s in streams
        }
        pending = {s.request_id for s in streams}
        while pending:
            self.engine.drain_inbox()
            self.engine.step()
            for s in streams:
                while not s.queue.empty():
                    out = s.queue.get()
                    res = results[s.request_id]
                    res.token_ids += out.token_ids
                    res.text += out.text
                    res.logprobs += out.logprobs
                    if out.finished:
                        if out.error:
                            raise RuntimeError(out.error)
                        res.finish_reason = out.finish_reason
                        res.num_cached_tokens = out.num_cached_tokens
                        pending.discard(s.request_id)
        return [results[s.request_id] for s in streams]
