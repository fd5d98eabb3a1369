"""The event loop every entry point runs on: uvloop when it is installed (it is a dependency
on Linux and macOS), else asyncio's own."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def settle_heap() -> None:
    """Once started: collect, then move every object alive now (modules, protobuf
    descriptors, the config, the parts of the app) to the collector's permanent generation.
    They live as long as the process, and a full collection no longer walks them, which
    keeps its pauses, which stall every poll on the loop, to what the polls themselves
    hold."""
    gc.collect()
    gc.freeze()


def run_main(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new loop. Only the import is guarded: an ImportError
    raised by ``main`` itself propagates, it never reruns ``main`` on the other loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
