"""The Python examples of the README and docs/api.md run as written (see `doc_examples`)."""

from __future__ import annotations

import pytest
from doc_examples import EXPECT, docs_with_examples, examples, run_example

pytestmark = pytest.mark.e2e

DOCS = ("README.md", "docs/api.md")
EXAMPLES = examples(*DOCS)


def test_every_doc_with_python_examples_is_run():
    from test_python_doc_examples import DOCS as PYTHON_DOCS

    assert docs_with_examples() == {*DOCS, *PYTHON_DOCS}
    sources = "\n".join(source for _, source in EXAMPLES + examples(*PYTHON_DOCS))
    for marker in EXPECT:
        assert marker in sources, f"no example uses {marker}"


@pytest.mark.parametrize("name,source", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_runs_as_written(request, tmp_path, smollm2_dir, name, source):
    run_example(request, tmp_path, source)
