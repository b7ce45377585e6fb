"""The request field table is the parsers' truth: they read exactly the fields it names, refuse
the refused ones, and unknown names are logged once each. docs/api.md is generated from it."""

import logging

import pytest

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server import api_doc
from mlx_paged.server.anthropic_request import parse_messages
from mlx_paged.server.api_fields import ACCEPTED, IGNORED, REFUSED, UnknownFieldLog, names
from mlx_paged.server.protocol import parse_chat, parse_completion

DEFAULTS = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
MINIMAL = {
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
    "completion": {"prompt": "hi"},
    "messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
}
PARSE = {"chat": parse_chat, "completion": parse_completion, "messages": parse_messages}
ROUTES = list(PARSE)


class RecordingBody(dict):
    """A request body that records every top-level name the parser looks up."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


@pytest.mark.parametrize("route", ROUTES)
def test_parsers_read_exactly_the_accepted_and_refused_fields(tiny_tokenizer, route):
    body = RecordingBody(MINIMAL[route])
    PARSE[route](body, tiny_tokenizer, DEFAULTS)
    assert body.read == names(route, ACCEPTED) | names(route, REFUSED)


@pytest.mark.parametrize("route", ROUTES)
def test_every_refused_field_is_refused_by_name(tiny_tokenizer, route):
    for name in names(route, REFUSED):
        bad = {"modalities": ["audio"], "response_format": {"type": "json_object"}}.get(name, 2)
        with pytest.raises(InvalidRequestError) as info:
            PARSE[route]({**MINIMAL[route], name: bad}, tiny_tokenizer, DEFAULTS)
        assert info.value.param == name and info.value.status == 400


@pytest.mark.parametrize("route", ROUTES)
def test_ignored_fields_change_nothing(tiny_tokenizer, route):
    plain = PARSE[route](dict(MINIMAL[route]), tiny_tokenizer, DEFAULTS)
    extra = {name: "x" for name in names(route, IGNORED)}
    got = PARSE[route]({**MINIMAL[route], **extra}, tiny_tokenizer, DEFAULTS)
    assert got == plain


def test_unknown_fields_are_logged_once_per_name(caplog):
    log = UnknownFieldLog(limit=3)
    with caplog.at_level(logging.WARNING, logger="mlx_paged.server"):
        assert log.note("chat", {"messages": [], "frobnicate": 1, "user": "u"}) == ["frobnicate"]
        assert log.note("chat", {"frobnicate": 2}) == []
        assert log.note("completion", {"messages": 1, "b": 1, "c": 1, "d": 1}) == [
            "b",
            "c",
        ]  # `messages` is unknown to completions; the limit of 3 names is reached
        assert log.note("chat", {"zzz": 1}) == []
    text = caplog.text
    assert text.count("'frobnicate'") == 1 and "'user'" not in text
    assert "3 unknown field names logged; no more will be" in text


def test_chat_template_kwargs_reach_the_template(tiny_tokenizer):
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{{ greeting }}"
    tiny_tokenizer.chat_template, saved = template, tiny_tokenizer.chat_template
    try:
        with_kwargs = parse_chat(
            {**MINIMAL["chat"], "chat_template_kwargs": {"greeting": " and hello"}},
            tiny_tokenizer,
            DEFAULTS,
        )
    finally:
        tiny_tokenizer.chat_template = saved
    assert tiny_tokenizer.decode(with_kwargs.prompt_token_ids).endswith("hi and hello")
    for bad, fragment in (("x", "must be an object"), ({"tokenize": False}, "set by the server")):
        with pytest.raises(InvalidRequestError, match=fragment):
            parse_chat({**MINIMAL["chat"], "chat_template_kwargs": bad}, tiny_tokenizer, DEFAULTS)


def test_api_doc_is_generated_from_the_field_table():
    assert api_doc.DOC.read_text() == api_doc.render(), "run `make api-docs`"
