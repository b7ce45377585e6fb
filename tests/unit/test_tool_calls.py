import json

from mlx_paged.server.tool_calls import ToolCallExtractor


def json_parser(text, _tools):
    return json.loads(text)


def run(pieces):
    ex = ToolCallExtractor("<tool_call>", "</tool_call>", json_parser, [])
    content, calls = "", []
    for p in pieces:
        c, k = ex.feed(p)
        content += c
        calls += k
    c, k = ex.flush()
    return content + c, calls


def test_split_markers_and_call_are_extracted():
    content, calls = run(
        [
            "Sure. <tool",
            '_call>{"name": "get", ',
            '"arguments": {"city": ',
            '"Paris"}}</tool_',
            "call> done",
        ]
    )
    assert content == "Sure.  done"
    assert calls == [
        {
            "index": 0,
            "id": calls[0]["id"],
            "type": "function",
            "function": {"name": "get", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert calls[0]["id"].startswith("call_")


def test_two_calls_get_increasing_indices():
    one = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    two = '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    _, calls = run([one + two])
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "a"), (1, "b")]


def test_text_that_only_looks_like_a_marker_is_released():
    assert run(["a <to", "y> b"]) == ("a <toy> b", [])


def test_unparseable_call_is_dropped_not_raised():
    assert run(["<tool_call>{broken</tool_call>ok"]) == ("ok", [])
