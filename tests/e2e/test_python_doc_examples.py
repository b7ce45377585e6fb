"""The examples of docs/python.md run as written (see `doc_examples`)."""

from __future__ import annotations

import pytest
from doc_examples import examples, run_example

pytestmark = pytest.mark.e2e

DOCS = ("docs/python.md",)
EXAMPLES = examples(*DOCS)


@pytest.mark.parametrize("name,source", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_runs_as_written(request, tmp_path, smollm2_dir, name, source):
    run_example(request, tmp_path, source)
