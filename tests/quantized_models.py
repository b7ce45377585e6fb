"""Tiny random models with quantized weights, as mlx-lm's `convert -q` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.nn as nn
from mlx_lm import load
from mlx_lm.utils import save_config, save_model
from tiny_models import build_model


def build_quantized_model(out: Path, model_type: str, **overrides) -> Path:
    """`build_model`'s model with its weights quantized to 4 bits in groups of 32, as
    mlx-lm's `convert -q` saves one (a head size of 32 or more lets the groups divide it)."""
    path = build_model(out, model_type, **overrides)
    model, _ = load(str(path))
    nn.quantize(model, group_size=32, bits=4)
    save_model(path, model)
    config = {**json.loads((path / "config.json").read_text()),
              "quantization": {"group_size": 32, "bits": 4}}  # fmt: skip
    save_config(config, config_path=path / "config.json")
    return path
