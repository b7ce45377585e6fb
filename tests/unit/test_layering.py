"""The engine drives the runners, the runners drive the KV path: no module imports upward, so
kv/, runner/ and engine/ have no import loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
# package -> the packages above it, which it must not import
ABOVE = {"kv": ("runner", "engine", "server"), "runner": ("engine", "server")}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_no_module_imports_a_package_above_its_own(package):
    files = sorted((RUNTIME / package).glob("*.py"))
    assert files
    upward = {
        (f.name, name)
        for f in files
        for name in imported_modules(f)
        if any(name.startswith(f"mlx_paged.{above}") for above in ABOVE[package])
    }
    assert upward == set()
