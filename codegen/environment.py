"""The one Jinja environment every kernel template renders in."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from .dialects import get_dialect


@functools.cache
def environment(folder: Path) -> jinja2.Environment:
    """Templates come from the caller's `folder`; an undefined name is an error, not blank
    text."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(folder: Path, template: str, spec, **context) -> str:
    """Render `template` of `folder` for `spec` (any object with a `backend`); `spec` and
    `dialect` are always in scope."""
    env = environment(folder)
    return env.get_template(template).render(
        spec=spec, dialect=get_dialect(spec.backend), **context
    )


def render_macro(folder: Path, template: str, macro: str, spec) -> str:
    """Render one macro of a template (e.g. the CUDA helper header) for `spec`'s backend."""
    module = (
        environment(folder)
        .get_template(template)
        .make_module({"spec": spec, "dialect": get_dialect(spec.backend)})
    )
    return str(getattr(module, macro)())
