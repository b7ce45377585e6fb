"""Shared fixtures: tiny random models built offline, and the embedded SmolLM2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import build_model  # noqa: E402

TINY_TYPES = ("llama", "qwen3", "gemma3_text")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: the folder of a tiny random model of a given type (built once per session)."""
    built: dict[str, Path] = {}

    def get(model_type: str = "llama") -> Path:
        if model_type not in built:
            built[model_type] = build_model(
                tmp_path_factory.mktemp(f"tiny-{model_type}"), model_type
            )
        return built[model_type]

    return get


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny_model_dir("llama"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The embedded default model, prepared (or reused) in the user cache."""
    from mlx_paged.models.default_model import default_model_path

    return default_model_path()
