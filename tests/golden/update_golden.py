"""Regenerate the Metal golden files after an intended kernel change:

    .venv/bin/python tests/golden/update_golden.py

Writes the full MSL of the golden specs (`metal/<spec>.metal`) that
`tests/integration/test_metal_codegen.py` compares against. Review the diff before committing it.
"""

from __future__ import annotations

from pathlib import Path

from mlx_paged.kernels.metal_capture import capture_metal_source

HERE = Path(__file__).parent / "metal"


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "integration"))
    from test_metal_codegen import GOLDEN_SPECS

    HERE.mkdir(exist_ok=True)
    for old in HERE.glob("*"):
        old.unlink()
    for spec in GOLDEN_SPECS:
        (HERE / f"{spec.name}.metal").write_text(capture_metal_source(spec))
    print(f"wrote {len(GOLDEN_SPECS)} sources under {HERE}")


if __name__ == "__main__":
    main()
