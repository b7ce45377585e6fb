"""Progress of long work: log lines with counts and an estimate away from a terminal, a tqdm
bar on one."""

import logging

from mlx_paged import progress as progress_module
from mlx_paged.progress import Progress, progress


def test_log_lines_count_and_estimate_what_is_left(caplog, monkeypatch):
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="mlx_paged.progress"):
        assert list(progress(range(4), "warming shapes", unit="shape")) == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "warming shapes: 0/4 shape"
    assert [line.split(",")[0] for line in lines[1:]] == [
        f"warming shapes: {i}/4 shape" for i in (1, 2, 3, 4)
    ]
    assert all("s left" in line for line in lines[1:4]) and "left" not in lines[4]
    assert len(lines) == 5  # the last count is not logged twice


def test_quiet_between_intervals_but_always_a_last_line(caplog):
    with caplog.at_level(logging.INFO, logger="mlx_paged.progress"):
        with Progress("generating", total=100, unit="tok") as bar:
            bar.update(40)
            bar.update(60)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "generating: 0/100 tok"
    assert lines[1].startswith("generating: 100/100 tok, ") and len(lines) == 2


def test_unknown_totals_have_no_estimate(caplog):
    with caplog.at_level(logging.INFO, logger="mlx_paged.progress"):
        list(progress(iter("abc"), "reading"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "reading: 0 it" and lines[1].startswith("reading: 3 it, ")


def test_a_bar_on_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(progress_module, "on_terminal", lambda: True)
    assert list(progress([1, 2], "converting GGUF tensors", unit="tensor")) == [1, 2]
    err = capsys.readouterr().err
    assert "converting GGUF tensors" in err and "2/2" in err
