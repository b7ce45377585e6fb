"""`--model` resolution: a local folder, a hub name, or a path that does not exist (named as
such, not sent to the hub as a repo id)."""

import re

import pytest

from mlx_paged.models.loader import looks_like_path, resolve_model


@pytest.mark.parametrize(
    "name", ["/nonexistent", "./model", "../models/x", "~/models/x", "a/b/c", "models/", "C:\\m"]
)
def test_a_missing_path_is_no_such_folder(name):
    assert looks_like_path(name)
    with pytest.raises(ValueError, match=re.escape(f"--model {name}: no such folder")):
        resolve_model(name)


@pytest.mark.parametrize("name", ["mlx-community/Qwen3-4B-4bit", "gpt2"])
def test_hub_names_pass_through(name):
    assert not looks_like_path(name)
    assert resolve_model(name) == (name, name)


def test_a_folder_needs_a_config_and_a_file_is_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == (str(tmp_path), str(tmp_path))
    with pytest.raises(ValueError, match="not a folder"):
        resolve_model(str(tmp_path / "config.json"))
