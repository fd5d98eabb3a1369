"""The event loop every entry point runs on: uvloop when it is installed (it is a dependency
on Linux and macOS), else asyncio's own."""

from __future__ import annotations

import asyncio
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
