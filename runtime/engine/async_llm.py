"""The engine for asyncio programs (another web framework, an agent loop): the engine runs in
its own process, as under `mlx-paged serve`, and every call is a coroutine that never blocks the
event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from mlx_paged.engine.chat_prompt import chat_messages, render_chat
from mlx_paged.engine.completion import CompletionDelta, CompletionResult, ResultBuilder
from mlx_paged.engine.config import EngineConfig
from mlx_paged.engine.llm import Conversation, Prompt, encode_prompt
from mlx_paged.sampling.sampling_params import SamplingParams


class AsyncLLM:
    """Serve one model to coroutines; many requests run at once, continuously batched.

    Use it as `async with AsyncLLM(model) as llm:` (or `await llm.start()` and
    `await llm.shutdown()`). The engine process is spawned, so the program's entry point must
    sit under `if __name__ == "__main__":`.

    Args:
        model: an mlx-lm folder or hub name; None is the embedded SmolLM2-135M-Instruct.
        chat_template: replaces the tokenizer's chat template.
        log_level: the engine process's log level.
        **engine_options: `EngineConfig` fields, named as `LLM`'s keyword arguments
            (`kv_paged`, `max_num_seqs`, `num_blocks`, `kv_bits`, ...).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        chat_template: str | None = None,
        log_level: str = "WARNING",
        **engine_options,
    ):
        self.config = EngineConfig(**engine_options)
        self._model, self._chat_template, self._log_level = model, chat_template, log_level
        self._client = None
        self.tokenizer = None
        self.model_id: str | None = None

    async def start(self) -> AsyncLLM:
        """Load the tokenizer here and the model in the engine process; returns when it serves.

        Raises:
            EngineStartError: the model could not be loaded or served.
        """
        await asyncio.to_thread(self._start)
        return self

    def _start(self) -> None:
        from mlx_paged.engine.core_client import EngineClient
        from mlx_paged.engine.core_process import EngineProcessSpec
        from mlx_paged.models.loader import load_front

        self.tokenizer, self.model_id, _, path = load_front(self._model, self._chat_template)
        spec = EngineProcessSpec(path, self._chat_template, self.config, self._log_level)
        client = EngineClient(spec, self.tokenizer)
        client.start()
        self._client = client

    async def shutdown(self) -> None:
        """Stop the engine process; requests still running end with `GenerationError`."""
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.shutdown)

    async def __aenter__(self) -> AsyncLLM:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    async def generate(
        self, prompt: Prompt | Conversation, params: SamplingParams | None = None
    ) -> CompletionResult:
        """The whole output of one prompt: text, token ids, or a conversation (rendered by the
        chat template). Run several with `asyncio.gather` and they share the batch."""
        async for delta in self.stream(prompt, params):
            if delta.finished:
                return delta.result
        raise AssertionError("a stream ends with a finished delta")  # pragma: no cover

    async def chat(
        self,
        messages: Conversation,
        params: SamplingParams | None = None,
        *,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> CompletionResult:
        """The answer to one conversation, rendered by the model's chat template."""
        ids = render_chat(
            self.tokenizer, chat_messages(list(messages)), tools, chat_template_kwargs
        )
        return await self.generate(ids, params)

    async def stream(
        self, prompt: Prompt | Conversation, params: SamplingParams | None = None
    ) -> AsyncIterator[CompletionDelta]:
        """Yield one prompt's output increments as the engine makes them; the last has
        `finished` set and the whole `result`. Leaving the loop early cancels the request."""
        if self._client is None:
            raise RuntimeError("the engine is not running: use `async with AsyncLLM(...)`")
        ids = encode_prompt(self.tokenizer, prompt)
        params = dataclasses.replace(params or SamplingParams())
        self._client.check_request(ids, params)
        stream = self._client.add_request(ids, params)
        builder = ResultBuilder(stream.request_id, ids)
        arrived = asyncio.Event()
        stream.on_output = _waker(asyncio.get_running_loop(), arrived)
        try:
            while not builder.finished:
                arrived.clear()
                while not builder.finished and not stream.queue.empty():
                    yield builder.add(stream.queue.get_nowait())
                if not builder.finished:
                    await arrived.wait()
        finally:
            stream.on_output = None
            if not builder.finished:
                stream.cancel()


def _waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event):
    """A callback for the engine's reader thread that sets `event` on `loop`'s thread."""

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    return wake
