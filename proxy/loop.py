"""The event loop every entry point runs on: uvloop when it is installed (it is a dependency
on Linux and macOS), else asyncio's own; and the process's open-files limit, raised before
it serves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_main(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new loop. Only the import is guarded: an ImportError
    raised by ``main`` itself propagates, it never reruns ``main`` on the other loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


log = logging.getLogger(__name__)


def raise_open_files_limit() -> int | None:
    """Raise the soft open-files limit to the hard one and say what it is: every client
    of the gRPC port holds three descriptors (its socket, the relay's two), so the common
    default of 1,024 serves about 300 clients. The new soft limit; None where there is no
    such limit (not POSIX). Worker processes inherit it."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.warning("open files: soft limit %d, not raised to the hard %d: %s", soft, hard, exc)
            return soft
        log.info("open files: soft limit raised from %d to the hard limit %d", soft, hard)
        return hard
    log.info("open files: soft limit %s (hard %s)", soft, hard)
    return soft
