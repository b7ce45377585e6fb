"""The one Jinja environment every kernel template renders in."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from .dialects import get_dialect
from .spec import KernelSpec

@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """Templates come from the kernels package; an undefined name is an error, not blank text."""
    import mlx_paged.kernels as kernels_pkg

    folder = Path(kernels_pkg.__file__).resolve().parent
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, spec: KernelSpec, **context) -> str:
    """Render `template` for `spec`'s backend; `spec` and `dialect` are always in scope."""
    env = environment()
    return env.get_template(template).render(spec=spec, dialect=get_dialect(spec.backend),
                                             **context)


def render_macro(template: str, macro: str, spec: KernelSpec) -> str:
    """Render one macro of a template (e.g. the CUDA helper header) for `spec`'s backend."""
    module = environment().get_template(template).make_module(
        {"spec": spec, "dialect": get_dialect(spec.backend)})
    return str(getattr(module, macro)())
