"""What both mlx-paged processes (the front and the engine process) share: the log format and
a clean way out."""

from __future__ import annotations

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
