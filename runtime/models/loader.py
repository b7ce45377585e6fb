"""Resolve `--model` and load it through mlx-lm."""

from __future__ import annotations

import logging
from pathlib import Path

from mlx_paged.models.default_model import DEFAULT_MODEL_NAME, default_model_path

logger = logging.getLogger(__name__)


def resolve_model(model: str | None) -> tuple[str, str]:
    """Return (path or hub name to load, the id the API reports) for a `--model` value.

    `None` or the default's name means the embedded SmolLM2, prepared on first use.
    """
    if model is None or model == DEFAULT_MODEL_NAME:
        return str(default_model_path()), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"--model {model}: not a folder; pass an mlx-lm model folder")
        if not (path / "config.json").is_file():
            raise ValueError(f"--model {model}: folder has no config.json; is it an mlx-lm model?")
        return str(path), model
    if looks_like_path(model):
        raise ValueError(f"--model {model}: no such folder")
    return model, model


def looks_like_path(model: str) -> bool:
    """Whether `model` can only be a local path: a hub name is `name` or `owner/name`, never
    absolute, relative to `.`/`~`, or with more than one slash."""
    return (
        model.startswith(("/", ".", "~"))
        or "\\" in model
        or model.count("/") > 1
        or model.endswith("/")
    )


def load_model(model: str | None, chat_template: str | None = None):
    """Load (model, tokenizer, model_id, config) through `mlx_lm.load`.

    Args:
        model: a local mlx-lm folder, a hub name, or None for the embedded default.
        chat_template: a Jinja chat template that replaces the tokenizer's own.
    """
    from mlx_lm import load

    source, model_id = resolve_model(model)
    logger.info("loading %s", source)
    tokenizer_config = {"chat_template": chat_template} if chat_template else None
    loaded, tokenizer, config = load(source, tokenizer_config=tokenizer_config, return_config=True)
    return loaded, tokenizer, model_id, config


def load_front(model: str | None, chat_template: str | None = None):
    """What the front process needs without the weights: (tokenizer, model_id, config, path).

    `path` is the local folder (a hub name is downloaded first), for the engine process to
    load the weights from.
    """
    from mlx_lm.utils import _download, load_config, load_tokenizer  # `load`'s own steps

    source, model_id = resolve_model(model)
    path = _download(source)
    config = load_config(path)
    tokenizer_config = {"chat_template": chat_template} if chat_template else None
    tokenizer = load_tokenizer(
        path, tokenizer_config, eos_token_ids=config.get("eos_token_id", None)
    )
    return tokenizer, model_id, config, str(path)
