"""Run the Python examples of the docs as written: each in a fresh interpreter, with the
embedded SmolLM2; the OpenAI client examples against the real server (its port put in place
of 8080). Two test modules use it, so the two test workers share the examples."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# What an example prints when it works (beyond exiting 0), by what its source contains.
EXPECT = {
    "llm.generate(": r"(?m)^(stop|length) ",
    "llm.chat(": r"\S",
    "delta.result.finish_reason": r"\[(stop|length), \d+ tokens\]",
    "AsyncLLM(": r"capital of France\? -> .*\nName a color\. -> ",
    "OpenAI(": r"\S",
    "Anthropic(": r"\S",
}


def examples(*docs: str) -> list[tuple[str, str]]:
    """(doc:index, source) of every ```python block of `docs` (paths from the repo root)."""
    out = []
    for doc in docs:
        for i, block in enumerate(FENCE.findall((ROOT / doc).read_text())):
            out.append((f"{doc}:{i}", block))
    return out


def docs_with_examples() -> set[str]:
    """Every Markdown file of the README and docs/ that holds a Python example."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(p.relative_to(ROOT)) for p in paths if FENCE.search(p.read_text())}


def run_example(request, tmp_path: Path, source: str) -> None:
    """Run `source` as a script; it must exit 0 and print what `EXPECT` says."""
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
