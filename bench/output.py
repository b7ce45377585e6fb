"""What every benchmark writes: its JSON result, the device it ran on, and its plot."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx


def device_name() -> str:
    """The device MLX runs on, as the results name it."""
    return mx.device_info().get("device_name", str(mx.default_device()))


def write_result(result: dict, out: str | Path) -> Path:
    """Write `result` as indented JSON to `out` (folders made as needed); returns the path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def load_pyplot():
    """matplotlib's pyplot on a file-only backend, or None (with a hint) when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    return plt
