"""Every request field the completion routes know: what each does here, and whether it is
accepted, ignored or refused. The parsers read their ignored and refused fields from this table,
`docs/api.md` is generated from it, and a test checks that the parsers read exactly the fields
it names, so the docs cannot drift from the server."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

logger = logging.getLogger("mlx_paged.server")

CHAT, COMPLETION, MESSAGES = "chat", "completion", "messages"
BOTH = (CHAT, COMPLETION)
ACCEPTED, IGNORED, REFUSED = "accepted", "ignored", "refused"
MAX_LOGGED_UNKNOWN = 256  # distinct unknown names logged before the log stops naming them


@dataclass(frozen=True)
class Field:
    """One request field: its name, the routes that know it, its status and what it does."""

    name: str
    routes: tuple[str, ...]
    status: str
    what: str


FIELDS: tuple[Field, ...] = (
    Field("model", BOTH, ACCEPTED, "the served model's id (`GET /v1/models`), the `--model` "
          "value, or `default`; another name is a 404 `model_not_found`; omitted: the served "
          "model"),
    Field("messages", (CHAT,), ACCEPTED, "required; roles `system`, `developer`, `user`, "
          "`assistant`, `tool`; content a string or a list of text parts (images and audio are "
          "refused); `tool_calls`, `name`, `tool_call_id` are passed to the chat template"),
    Field("prompt", (COMPLETION,), ACCEPTED, "required; one prompt: a string or a list of token "
          "ids (a list of several prompts is refused)"),
    Field("max_tokens", BOTH, ACCEPTED, "most tokens to generate, 1 to 1,000,000 and within the "
          "context length (default: `--max-tokens`, shortened to fit the context)"),
    Field("max_completion_tokens", (CHAT,), ACCEPTED, "the same as `max_tokens`; wins over it"),
    Field("stream", BOTH, ACCEPTED, "server-sent events, ended by `data: [DONE]`"),
    Field("stream_options", BOTH, ACCEPTED, "`{\"include_usage\": true}` adds a last chunk "
          "with `usage`; only with `stream: true`"),
    Field("temperature", BOTH, ACCEPTED, "0 to 100; 0 is greedy (default: `--temp`)"),
    Field("top_p", BOTH, ACCEPTED, "nucleus sampling, in (0, 1] (default: `--top-p`)"),
    Field("top_k", BOTH, ACCEPTED, "keep the k likeliest tokens; 0 is off (default: `--top-k`)"),
    Field("speculate", BOTH, ACCEPTED, "false keeps speculative drafts (`--draft-model`) off "
          "this request's rows (default true)"),
    Field("min_p", BOTH, ACCEPTED, "drop tokens below min_p times the top probability; 0 is "
          "off (default: `--min-p`)"),
    Field("repetition_penalty", BOTH, ACCEPTED, "mlx-lm's multiplicative penalty on tokens of "
          "the last `repetition_context_size` tokens, in (0, 100]; off when absent"),
    Field("repetition_context_size", BOTH, ACCEPTED, "tokens the penalties look back (default "
          "20)"),
    Field("presence_penalty", BOTH, ACCEPTED, "OpenAI's additive penalty on tokens already "
          "present, -2 to 2"),
    Field("frequency_penalty", BOTH, ACCEPTED, "OpenAI's additive penalty per occurrence, -2 "
          "to 2"),
    Field("xtc_probability", BOTH, ACCEPTED, "mlx-lm's XTC sampler: how often it cuts the top "
          "choices (default 0, off)"),
    Field("xtc_threshold", BOTH, ACCEPTED, "XTC's probability threshold, 0 to 0.5 (default "
          "0.1)"),
    Field("logit_bias", BOTH, ACCEPTED, "token id to a bias added to its logit, -100 to 100"),
    Field("seed", BOTH, ACCEPTED, "reproducible sampling; a seeded request runs alone once the "
          "batch drains"),
    Field("stop", BOTH, ACCEPTED, "a string or up to 16 strings of up to 256 characters that "
          "end the output (not included in it)"),
    Field("logprobs", BOTH, ACCEPTED, "chat: a boolean; completions: the number of top "
          "log-probabilities per token (0 to 20)"),
    Field("top_logprobs", (CHAT,), ACCEPTED, "top log-probabilities per token, 0 to 20; needs "
          "`logprobs: true`"),
    Field("return_tokens_as_token_ids", BOTH, ACCEPTED, "vLLM's: log-probability tokens as "
          "`token_id:<id>` strings"),
    Field("tools", (CHAT,), ACCEPTED, "function tools, rendered by the model's chat template, "
          "or, where it has no tools, written into the system turn in one format "
          "(`<tool_call>{\"name\", \"arguments\"}</tool_call>`); calls come back as "
          "`tool_calls`. A `strict` function's arguments always validate: forced calls are "
          "grammar-constrained whole; under `auto` the call after a one-token `<tool_call>` "
          "marker is (the answer then ends with it), and models that spell the marker in "
          "several tokens get a 400"),
    Field("chat_template_kwargs", (CHAT,), ACCEPTED, "an object of extra variables for the "
          "chat template, e.g. `{\"enable_thinking\": false}`; a reasoning model's thinking "
          "comes back as `reasoning_content`"),
    Field("n", BOTH, REFUSED, "only 1: send several requests for several completions"),
    Field("best_of", BOTH, REFUSED, "only 1"),
    Field("echo", BOTH, REFUSED, "echoing the prompt is not supported"),
    Field("suffix", BOTH, REFUSED, "insertion is not supported"),
    Field("response_format", BOTH, ACCEPTED, "`text`; `json_object` (any JSON object) or "
          "`json_schema` (`{\"json_schema\": {\"name\", \"schema\", \"strict\"}}`): sampling is "
          "constrained so that the output parses and validates (compact JSON, `finish_reason` "
          "`stop` when it is complete); a schema that cannot constrain output is a 400"),
    Field("functions", BOTH, REFUSED, "the deprecated form of `tools`: send `tools`"),
    Field("function_call", BOTH, REFUSED, "the deprecated form of `tool_choice`"),
    Field("audio", BOTH, REFUSED, "text only"),
    Field("prediction", BOTH, REFUSED, "predicted outputs are not supported"),
    Field("logit_bias_schema", BOTH, REFUSED, "not supported"),
    Field("modalities", BOTH, REFUSED, "only `[\"text\"]`"),
    Field("tool_choice", (CHAT,), ACCEPTED, "`auto` (the model decides), `none` (tools not "
          "offered), `required` or a named function: exactly one call, its arguments "
          "validating, grammar-constrained (templates that call tools in the `<tool_call>` "
          "JSON format, or have none; others are a 400)"),
    Field("tool_choice", (COMPLETION,), IGNORED, "completions take no tools"),
    Field("parallel_tool_calls", BOTH, IGNORED, "every call the model makes is returned"),
    Field("user", BOTH, IGNORED, "an end-user id for abuse tracking: one local server has none"),
    Field("metadata", BOTH, IGNORED, "stored-completion tags: nothing is stored"),
    Field("store", BOTH, IGNORED, "nothing is stored"),
    Field("service_tier", BOTH, IGNORED, "one tier"),
    Field("role_mapping", BOTH, IGNORED, "mlx_lm.server's option for models without a chat "
          "template; the template (or `role: content` lines without one) decides"),
    # Anthropic's Messages API (`POST /v1/messages`; `count_tokens` reads the same fields).
    Field("model", (MESSAGES,), ACCEPTED, "as on the OpenAI routes: the served model's id, "
          "an alias, or `default`; another name is a 404 `not_found_error`"),
    Field("messages", (MESSAGES,), ACCEPTED, "required; `user` and `assistant` turns, content a "
          "string or blocks: `text`, `tool_use` (assistant), `tool_result` (user; `is_error` "
          "prefixes `Error: `); `thinking` blocks are dropped; `image` and `document` are a 400 "
          "on a text-only model"),
    Field("system", (MESSAGES,), ACCEPTED, "a string or a list of text blocks: the system turn"),
    Field("max_tokens", (MESSAGES,), ACCEPTED, "required; 1 to 1,000,000 and within the context"),
    Field("stop_sequences", (MESSAGES,), ACCEPTED, "strings that end the output: `stop_reason` "
          "is then `stop_sequence`, and `stop_sequence` names the one that matched"),
    Field("temperature", (MESSAGES,), ACCEPTED, "0 is greedy (default: `--temp`); clients "
          "send it as an extra body field"),
    Field("top_p", (MESSAGES,), ACCEPTED, "nucleus sampling (default: `--top-p`)"),
    Field("speculate", (MESSAGES,), ACCEPTED, "as on the OpenAI routes: false keeps "
          "speculative drafts off this request's rows"),
    Field("top_k", (MESSAGES,), ACCEPTED, "keep the k likeliest tokens (default: `--top-k`)"),
    Field("stream", (MESSAGES,), ACCEPTED, "Anthropic's named events: `message_start`, "
          "`content_block_start`, `content_block_delta`, `content_block_stop`, `message_delta`, "
          "`message_stop`; `ping` while a request waits"),
    Field("tools", (MESSAGES,), ACCEPTED, "custom tools (`name`, `description`, "
          "`input_schema`), rendered as on `/v1/chat/completions`; calls come back as "
          "`tool_use` blocks with `stop_reason: tool_use`; server tools are a 400; `strict` "
          "as on `/v1/chat/completions`"),
    Field("tool_choice", (MESSAGES,), ACCEPTED, "`auto`, `none` (the tools are not offered), "
          "`any` or `tool` (exactly one call, its input validating, grammar-constrained, as "
          "`tool_choice` on `/v1/chat/completions`)"),
    Field("thinking", (MESSAGES,), ACCEPTED, "`{\"type\": \"enabled\"}` or `disabled`: the "
          "chat template's `enable_thinking`; the thinking comes back as `thinking` blocks "
          "(`thinking_delta` when streamed), with an empty `signature`"),
    Field("output_config", (MESSAGES,), ACCEPTED, "`{\"format\": {\"type\": \"json_schema\", "
          "\"schema\": ...}}`: structured outputs, sampling constrained so that the text "
          "validates; a schema that cannot constrain output is a 400"),
    Field("container", (MESSAGES,), REFUSED, "code execution runs on Anthropic's servers"),
    Field("mcp_servers", (MESSAGES,), REFUSED, "MCP connectors run on Anthropic's servers"),
    Field("context_management", (MESSAGES,), REFUSED, "not supported"),
    Field("metadata", (MESSAGES,), IGNORED, "`user_id` for abuse tracking: one local server "
          "has none"),
    Field("service_tier", (MESSAGES,), IGNORED, "one tier"),
)  # fmt: skip


def fields_for(route: str, status: str | None = None) -> tuple[Field, ...]:
    """The fields `route` ("chat", "completion" or "messages") knows, of one `status` if
    given."""
    return tuple(f for f in FIELDS if route in f.routes and (status is None or f.status == status))


def names(route: str, status: str | None = None) -> frozenset[str]:
    """The names of `fields_for(route, status)`."""
    return frozenset(f.name for f in fields_for(route, status))


class UnknownFieldLog:
    """Logs each unknown request field name once per process: unknown fields are ignored, as
    OpenAI clients expect, but not without a word."""

    def __init__(self, limit: int = MAX_LOGGED_UNKNOWN):
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def note(self, route: str, body: dict) -> list[str]:
        """Log the names in `body` that `route` does not know and were not logged before;
        returns them."""
        unknown = set(body) - names(route)
        with self._lock:
            new = sorted(unknown - self._seen)[: max(self.limit - len(self._seen), 0)]
            self._seen.update(new)
            full = len(self._seen) >= self.limit
        for name in new:
            shown = name if len(name) <= 64 else name[:61] + "..."
            logger.warning("ignoring unknown request field %r (logged once per name)", shown)
        if new and full:
            logger.warning("%d unknown field names logged; no more will be", self.limit)
        return new
