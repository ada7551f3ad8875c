"""What the benchmarks share. The scripts run as ``python bench/NAME.py``, so this module is
imported as ``_common`` (the script's own folder is first on ``sys.path``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def run_limited(call: Callable[[], Awaitable[Any]], times: int, concurrency: int) -> None:
    """``call()`` ``times`` times, at most ``concurrency`` at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with sem:
            await call()

    await asyncio.gather(*(limited() for _ in range(times)))


async def cpu_per_reply(call: Callable[[], Awaitable[Any]], calls: int, concurrency: int) -> float:
    """CPU ms of this process per reply, ``calls`` replies ``concurrency`` at a time."""
    cpu0 = time.process_time()
    await run_limited(call, calls, concurrency)
    return 1e3 * (time.process_time() - cpu0) / calls
