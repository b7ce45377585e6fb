"""Compile check of generated Metal source on machines without Metal.

clang's C++ front end (through the `libclang` wheel) parses the MSL MLX generated, against
`metal_shim.h`, which declares MSL's types and builtins. Errors come back as
`MetalCheckError` with clang's diagnostics. What it cannot see: address spaces, Metal
attributes and the real Metal compiler's back end (the numerics are shared with CUDA instead).
"""

from __future__ import annotations

import re
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "metal_shim.h"
# C++ does not allow attributes on an explicit instantiation; MSL does. The check drops them
# from that line only, so the instantiation (which type-checks the body for T) still happens.
_INSTANTIATION_ATTRS = re.compile(r'^template \[\[host_name\("[^"]*"\)\]\] \[\[kernel\]\] ', re.M)


class MetalCheckError(RuntimeError):
    """clang rejected the generated Metal source; the message holds the diagnostics."""


def check_metal_source(source: str, name: str = "kernel") -> list[str]:
    """Type-check `source` (a complete MLX-generated MSL kernel) with clang against the shim.

    Returns the warnings; raises `MetalCheckError` on any error.
    """
    try:
        import clang.cindex as cindex
    except ImportError as exc:
        raise MetalCheckError(
            "the Metal compile check needs the `libclang` package (pip install libclang)"
        ) from exc
    text = _INSTANTIATION_ATTRS.sub("template ", source)
    args = [
        "-x",
        "c++",
        "-std=c++17",
        "-fsyntax-only",
        "-Wno-unknown-attributes",
        "-include",
        str(SHIM),
    ]
    filename = f"{name}.metal.cpp"
    tu = cindex.Index.create().parse(filename, args=args, unsaved_files=[(filename, text)])
    errors, warnings = [], []
    for diag in tu.diagnostics:
        line = f"{diag.location.line}:{diag.location.column}: {diag.spelling}"
        if diag.severity >= cindex.Diagnostic.Error:
            errors.append(line)
        elif diag.severity == cindex.Diagnostic.Warning:
            warnings.append(line)
    if errors:
        numbered = text.splitlines()
        context = "\n".join(
            f"  > {numbered[int(e.split(':')[0]) - 1].strip()}"
            for e in errors[:5]
            if e.split(":")[0].isdigit() and int(e.split(":")[0]) <= len(numbered)
        )
        raise MetalCheckError(
            f"{name}: clang found {len(errors)} error(s):\n"
            + "\n".join(errors[:20])
            + ("\n" + context if context else "")
        )
    return warnings
