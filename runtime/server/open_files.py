"""The process's open-file limit against `--max-connections`: each connection is a descriptor,
and the soft limit (often 1024, 256 on macOS) would refuse connections long before the cap."""

from __future__ import annotations

import logging

logger = logging.getLogger("mlx_paged.server")

# Descriptors beside the connections: the listening socket, the engine pipe, the log, the
# model's files, MLX's and Python's own.
SPARE_DESCRIPTORS = 128


def raise_open_file_limit(max_connections: int) -> int | None:
    """Raise the soft `RLIMIT_NOFILE` toward `max_connections` plus spares, as far as the hard
    limit allows; log what was done, and warn when it is short. Returns the soft limit now
    (None where the platform has no such limit)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            logger.info("raised the open-file limit from %d to %d for --max-connections %d",
                        soft, target, max_connections)  # fmt: skip
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open-file limit from %d: %s", soft, exc)
    if soft != resource.RLIM_INFINITY and soft < need:
        logger.warning(
            "the open-file limit is %d: fewer than the %d that --max-connections %d needs; "
            "connections past it are refused by the system (raise `ulimit -n`)",
            soft, need, max_connections,
        )  # fmt: skip
    return soft
