"""Where a kernel's warps stall, instruction by instruction, from Nsight Compute's source page:

    ncu --section WarpStateStats --section SourceCounters -k regex:paged --launch-skip 2 \\
        --launch-count 1 -o rep python3 -m mlx_paged.bench.ncu_target 8 8192 decode_tc_splitk
    ncu --import rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 -m mlx_paged.bench.sass_stalls sass.csv

Prints the stall samples by opcode, the instructions with the most samples and their stall
reasons, and the instructions just before the top ones (what a stalled one waits on is
usually a few lines up)."""

from __future__ import annotations

import csv
import io
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_rows(text: str) -> list[dict]:
    """The per-instruction rows of the CSV (ncu writes a kernel-name line above the header)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError('no "Address" header line: not an `ncu --page source --csv` export')
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    if not rows or SAMPLES not in rows[0]:
        raise ValueError(f"no {SAMPLES!r} column: profile with --section SourceCounters")
    return rows


def _number(row: dict, column: str) -> float:
    try:
        return float(row[column].replace(",", ""))
    except (ValueError, AttributeError, KeyError):
        return 0.0


def report(rows: list[dict], top: int = 30, windows: int = 8) -> str:
    """The text report of `rows` (see the module docstring)."""
    total = sum(_number(r, SAMPLES) for r in rows) or 1.0
    by_opcode: Counter = Counter()
    for r in rows:
        by_opcode[(r["Source"].split() or ["?"])[0]] += _number(r, SAMPLES)
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    order = sorted(range(len(rows)), key=lambda i: -_number(rows[i], SAMPLES))
    out = [
        f"instructions {len(rows)}, samples {total:.0f}",
        "samples by opcode: " + ", ".join(f"{op} {int(n)}" for op, n in by_opcode.most_common(15)),
    ]
    for i in order[:top]:
        r = rows[i]
        why = {c: int(_number(r, c)) for c in reasons if _number(r, c) > 0}
        out.append(
            f"#{i:4d} {_number(r, SAMPLES):6.0f} ({_number(r, SAMPLES) / total:5.1%}) "
            f"{r['Source'][:70]:70s} {why}"
        )
    out.append("\nthe instructions before the top ones:")
    for i in sorted(order[:windows]):
        for j in range(max(0, i - 4), min(len(rows), i + 2)):
            out.append(f"#{j:4d} {_number(rows[j], SAMPLES):6.0f} {rows[j]['Source'][:90]}")
        out.append("--")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        print(report(read_rows(f.read())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
