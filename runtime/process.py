"""What both mlx-paged processes (the front and the engine process) share: the log format, the
garbage collector's setting for serving and a clean way out."""

from __future__ import annotations

import gc
import logging
import os
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def exit_now(code: int) -> None:
    """Leave without running interpreter teardown: MLX's native threads can abort the process
    ("terminate called without an active exception") while static objects are destroyed,
    turning a clean shutdown into exit code 134. Everything is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def freeze_startup_objects() -> None:
    """Keep what startup made (modules, the tokenizer, the model's objects, the block pool) out
    of the garbage collector's full passes: each such pass walked all of it, tens of
    milliseconds in the middle of a step, where every stream's next token waits. Called once
    serving starts, in a process of ours (not in a library user's)."""
    gc.collect()
    gc.freeze()
    logging.getLogger(__name__).info(
        "%d startup objects kept out of garbage collection passes", gc.get_freeze_count()
    )
