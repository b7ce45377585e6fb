"""Generation in this process: `LLM(model=...).generate(prompts, params)`, `.chat(messages)`,
`.stream(prompt)`; the engine steps on the caller's thread."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from mlx_paged.engine.chat_prompt import chat_messages, render_chat
from mlx_paged.engine.completion import CompletionDelta, CompletionResult, ResultBuilder
from mlx_paged.engine.config import EngineConfig
from mlx_paged.engine.core import Engine
from mlx_paged.models.loader import load_model
from mlx_paged.sampling.sampling_params import SamplingParams

Prompt = str | Sequence[int]
Conversation = Sequence[dict]


def is_conversation(prompt) -> bool:
    """Whether `prompt` is a chat conversation (a list of message dicts), not text or ids."""
    return not isinstance(prompt, str) and bool(prompt) and isinstance(prompt[0], dict)


def encode_prompt(tokenizer, prompt: Prompt | Conversation) -> list[int]:
    """Token ids of text (no chat template), token ids, or a conversation (chat template)."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    if is_conversation(prompt):
        return render_chat(tokenizer, chat_messages(list(prompt)))
    return list(prompt)


class LLM:
    """Load a model once and generate for batches of prompts, continuously batched.

    Args:
        model: an mlx-lm folder or hub name; None is the embedded SmolLM2-135M-Instruct.
        kv_paged: the paged KV path (default); False is the contiguous path, token-exact with
            mlx-lm's BatchGenerator.
        paged_attention: "auto", "kernel" or "reference" decode attention over pages.
        compile_decode: "auto", "on" or "off": replay decode steps from `mx.compile` traces.
        fused_rope: "auto", "on" or "off": RoPE inside the decode attention kernel.
        lean_decode: "auto", "on", "fused" or "off": llama-family decode steps in fewer
            graph nodes ("fused": fewer again, through the layer kernels; "auto": fused where
            the blocks allow it).
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
        prefill_chunk_seconds: how long a step with prompt work may take (paged path): prompt
            chunks are sized to fit and shared among prompts; None turns it off.
        prefill_itl_ratio: while sequences decode, a step with prompt work may take at most
            this many decode steps' time (paged path; None: only `prefill_chunk_seconds`).
        kv_groups: sliding-window layers in KV cache groups of their own, which free the
            blocks their window left (paged path); False keeps every layer in one group.
        draft_model: "ngram" drafts tokens by prompt lookup for speculative decoding
            (paged path); None (the default) decodes one token a step.
        num_draft_tokens: most tokens a draft holds.
        step_log: a file to append one JSON line a step to (`engine/step_log.py`); None: none.
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
        lean_decode: str = "auto",
        kv_bits: int = 16,
        kv_bits_k: int | None = None,
        kv_bits_v: int | None = None,
        kv_group_size: int = 64,
        prefill_chunk_seconds: float | None = 0.5,
        prefill_itl_ratio: float | None = None,
        kv_groups: bool = True,
        draft_model: str | None = None,
        num_draft_tokens: int = 4,
        step_log: str | None = None,
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
            lean_decode=lean_decode,
            kv_bits=kv_bits,
            kv_bits_k=kv_bits_k,
            kv_bits_v=kv_bits_v,
            kv_group_size=kv_group_size,
            prefill_chunk_seconds=prefill_chunk_seconds,
            prefill_itl_ratio=prefill_itl_ratio,
            kv_groups=kv_groups,
            draft_model=draft_model,
            num_draft_tokens=num_draft_tokens,
            step_log=step_log,
        )
        self.model, self.tokenizer, self.model_id, model_config = load_model(model, chat_template)
        self.engine = Engine(self.model, self.tokenizer, config, model_config)

    def encode(self, prompt: Prompt | Conversation) -> list[int]:
        """Token ids of a prompt given as text (encoded without a chat template), token ids, or
        a conversation (rendered by the model's chat template, generation prompt appended)."""
        return encode_prompt(self.tokenizer, prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionResult]:
        """Generate for every prompt, continuously batched; one result per prompt, in order.

        Args:
            prompts: a prompt or a list of prompts (text or token ids).
            params: one `SamplingParams` for all prompts, or one per prompt; default greedy.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run([self.encode(p) for p in prompts], params)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[CompletionResult]:
        """Answer one conversation or several (OpenAI-style message dicts), each rendered by the
        model's chat template; one result per conversation, in order.

        Args:
            tools: OpenAI function tools, for templates that render them.
            chat_template_kwargs: extra template variables, e.g. `{"enable_thinking": False}`.
        """
        conversations = [messages] if is_conversation(messages) else list(messages)
        ids = [
            render_chat(self.tokenizer, chat_messages(list(c)), tools, chat_template_kwargs)
            for c in conversations
        ]
        return self._run(ids, params)

    def stream(
        self, prompt: Prompt | Conversation, params: SamplingParams | None = None
    ) -> Iterator[CompletionDelta]:
        """Yield one prompt's output as it is generated: text and token-id increments, the last
        with `finished` set and the whole `result`. A conversation goes through the chat
        template. Leaving the loop early cancels the request."""
        ids = self.encode(prompt)
        builder, stream = self._add(ids, params or SamplingParams())
        try:
            while not builder.finished:
                self.engine.drain_inbox()
                self.engine.step()
                while not builder.finished and not stream.queue.empty():
                    yield builder.add(stream.queue.get())
        finally:
            if not builder.finished:
                stream.cancel()
                self.engine.drain_inbox()  # frees its blocks now, not at the next call

    def _add(self, ids: list[int], params: SamplingParams):
        params = dataclasses.replace(params)  # one copy per request: check_request may shorten it
        self.engine.check_request(ids, params)
        stream = self.engine.add_request(ids, params)
        return ResultBuilder(stream.request_id, ids), stream

    def _run(
        self, prompts: list[list[int]], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[CompletionResult]:
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        requests = []
        try:
            for ids, p in zip(prompts, params):
                requests.append(self._add(ids, p))
            # Only the unfinished are read after each step: a large batch's finished ones cost
            # nothing there.
            running = list(requests)
            while running:
                self.engine.drain_inbox()
                self.engine.step()
                for builder, stream in running:
                    while not builder.finished and not stream.queue.empty():
                        builder.fold(stream.queue.get())
                running = [entry for entry in running if not entry[0].finished]
        finally:  # one failed (or a bad prompt was refused): the others stop too
            for builder, stream in requests:
                if not builder.finished:
                    stream.cancel()
            self.engine.drain_inbox()
        return [builder.result for builder, _ in requests]
