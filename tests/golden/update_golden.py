"""Regenerate the Metal golden files after an intended kernel change:

    .venv/bin/python tests/golden/update_golden.py

Writes the full MSL of the representative specs (`metal/<spec>.metal`, reviewable) and the
SHA-256 of every spec's MSL (`metal/manifest.txt`). Review the diff before committing it.
"""

from __future__ import annotations

from pathlib import Path

from mlx_paged.codegen.catalog import all_specs, representative_specs
from mlx_paged.codegen.metal_capture import capture_metal_source, source_digest

HERE = Path(__file__).parent / "metal"


def main() -> None:
    HERE.mkdir(exist_ok=True)
    for old in HERE.glob("*.metal"):
        old.unlink()
    for spec in representative_specs("metal"):
        (HERE / f"{spec.name}.metal").write_text(capture_metal_source(spec))
    lines = [f"{spec.name} {source_digest(capture_metal_source(spec))}"
             for spec in all_specs("metal")]
    (HERE / "manifest.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} digests and {len(representative_specs('metal'))} sources "
          f"under {HERE}")


if __name__ == "__main__":
    main()
