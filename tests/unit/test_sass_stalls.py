"""The ncu source-page summary (`bench/sass_stalls.py`) on a small hand-written export."""

from __future__ import annotations

import pytest

from mlx_paged.bench import sass_stalls

_CSV = """"Kernel Name","custom_kernel_x"
"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb","stall_short_sb","stall_long_sb (Not Issued)"
"0x10","LDG.E R2, [R4.64]","1","0","0","0"
"0x20","IMAD R3, R2, R2, RZ","1,200","1,190","0","900"
"0x30","SHFL.IDX PT, R5, R3, RZ, 0x1f","300","0","300","0"
"0x40","IMAD R6, R5, R5, RZ","99","0","99","0"
"""


def test_report_ranks_instructions_by_stall_samples():
    rows = sass_stalls.read_rows(_CSV)
    assert len(rows) == 4
    text = sass_stalls.report(rows, top=2, windows=1)
    lines = text.splitlines()
    assert lines[0] == "instructions 4, samples 1600"
    assert lines[1] == "samples by opcode: IMAD 1299, SHFL.IDX 300, LDG.E 1"
    # The top two, with their (issued) reasons; "Not Issued" columns are left out.
    assert lines[2].startswith("#   1   1200 (75.0%) IMAD R3, R2, R2, RZ")
    assert lines[2].endswith("{'stall_long_sb': 1190}")
    assert lines[3].startswith("#   2    300 (18.8%) SHFL.IDX")
    # The window before the top one starts at the load it waits on.
    window = text.split("the instructions before the top ones:\n")[1].splitlines()
    assert window[0].startswith("#   0      1 LDG.E") and window[-1] == "--"


def test_not_a_source_page_export_is_refused():
    with pytest.raises(ValueError, match="Address"):
        sass_stalls.read_rows('"ID","Kernel Name"\n"0","x"\n')
    with pytest.raises(ValueError, match="SourceCounters"):
        sass_stalls.read_rows('"Address","Source"\n"0x10","NOP"\n')
