"""Every Python example in the README and docs/python.md runs as written: each in a fresh
interpreter, with the embedded SmolLM2; the OpenAI client examples against the real server
(its port put in place of 8080)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ("README.md", "docs/python.md", "docs/api.md")
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def examples() -> list[tuple[str, str]]:
    """(doc:index, source) of every ```python block of the docs."""
    out = []
    for doc in DOCS:
        for i, block in enumerate(FENCE.findall((ROOT / doc).read_text())):
            out.append((f"{doc}:{i}", block))
    return out


EXAMPLES = examples()
# What each example prints when it works (beyond exiting 0).
EXPECT = {
    "llm.generate(": r"(?m)^(stop|length) ",
    "llm.chat(": r"\S",
    "delta.result.finish_reason": r"\[(stop|length), \d+ tokens\]",
    "AsyncLLM(": r"capital of France\? -> .*\nName a color\. -> ",
    "OpenAI(": r"\S",
}


def test_the_docs_have_the_examples_this_test_expects():
    sources = "\n".join(source for _, source in EXAMPLES)
    for marker in EXPECT:
        assert marker in sources, f"no example uses {marker}"
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("name,source", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_runs_as_written(request, tmp_path, smollm2_dir, name, source):
    if "127.0.0.1:8080" in source:
        server = request.getfixturevalue("server")
        source = source.replace("http://127.0.0.1:8080", server.url)
    script = tmp_path / "example.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for marker, pattern in EXPECT.items():
        if marker in source:
            assert re.search(pattern, done.stdout), (marker, done.stdout)
