"""docs/benchmarks.md is what `make bench-docs` makes of bench/results/, and every committed
result is referenced from the docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_paged.bench import report

ROOT = Path(__file__).resolve().parent.parent.parent


def test_benchmarks_doc_is_generated_from_the_committed_results():
    assert report.DOC.read_text() == report.render(), "run `make bench-docs`"


def test_readme_table_and_prose_figures_are_generated_from_the_committed_results():
    readme = report.README.read_text()
    assert readme == report.render_readme(readme), "run `make bench-docs`"
    assert "<!-- fig:density -->" in readme


def test_an_unknown_prose_figure_is_an_error():
    with pytest.raises(ValueError, match="no figure named 'nope'"):
        report.fill_figures("a <!-- fig:nope -->1x<!-- /fig --> b", {"density": "2x"})
    filled = report.fill_figures("a <!-- fig:density -->1x<!-- /fig --> b", {"density": "2x"})
    assert filled == "a <!-- fig:density -->2x<!-- /fig --> b"


def test_every_result_file_is_referenced_from_the_docs():
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")])
    for path in (ROOT / "bench" / "results").iterdir():
        assert path.name in docs, f"{path.name} is referenced nowhere in the docs"


def test_check_mode_fails_on_a_stale_doc(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "benchmarks.md"
    stale.write_text("# Benchmarks\n")
    monkeypatch.setattr(report, "DOC", stale)
    assert report.main(["--check"]) == 1
    assert "make bench-docs" in capsys.readouterr().err
    assert report.main([]) == 0 and report.main(["--check"]) == 0
