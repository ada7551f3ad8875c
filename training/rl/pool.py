"""Pooled arena sandboxes for RL rollouts: reused across episodes, reset between them.

RL rolls out group size × batch episodes per step over tasks that recur across steps. A new
bubblewrap sandbox per episode costs 100–250 ms here (compiling a published-size record's
38–145k characters of tool source included); ``Sandbox.reset()`` — a fresh episode process
forked from the sandbox's pristine template, ``/tmp`` emptied, the tools' module code run anew
— costs a few ms and leaves nothing of the previous episode (globals, files, threads,
processes). So the pool keeps idle sandboxes keyed by a digest of the task's tool sources and
lends them out as :class:`~astra_agent.arena.ArenaEnvironment` s::

    async with SandboxPool(limits, max_idle=64) as pool:
        async with pool.environment(task) as env:
            traj = await run_episode(model, env, task.prompt)

The life of a sandbox: spawned by an acquire that finds no idle one with the task's sources →
lent → given back when the episode ends → reset in the background (off the episode's critical
path: the next acquire of the same sources waits for that reset rather than spawn) → idle,
most recently used last → lent again, or closed when more than ``max_idle`` are idle (least
recently used first) or when the pool closes. A reset that fails closes the sandbox (the next
acquire spawns a new one). A tool that hung or crashed mid-episode needs nothing special: the
sandbox replaced its episode process itself, and the reset gives the next episode a fresh one.

Everything runs on one event loop: the bookkeeping between two ``await`` s is atomic, so no
lock is needed. ``max_live`` bounds the sandboxes that exist at once (idle, lent, starting,
resetting): an acquire beyond it closes the least recently used idle one, or waits for a
sandbox to be given back. An episode that holds one environment while acquiring another can
therefore wait forever at ``max_live=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any, Self

from astra_agent.arena import ArenaEnvironment, ArenaTask
from astra_agent.environment import ToolResult
from astra_agent.errors import ConfigError
from astra_agent.sandbox import Sandbox, SandboxLimits, bwrap_available

log = logging.getLogger(__name__)

# How long an acquire waits for a sandbox of its sources that is being reset before it starts
# a new one (a reset takes ~5-20 ms; one that waits for an abandoned call, seconds).
RESET_WAIT_S = 0.5


class SandboxPoolError(ConfigError):
    """The pool or one of its environments was used outside its lifetime."""


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's counters (cumulative) and of its sandboxes (now)."""

    spawned: int = 0  # sandboxes started
    reused: int = 0  # acquires served by an idle sandbox
    evicted: int = 0  # idle sandboxes closed to stay within max_idle / max_live
    resets: int = 0  # background resets that succeeded
    reset_failures: int = 0  # resets that raised (the sandbox was closed)
    waits: int = 0  # times an acquire waited (max_live, or a reset of its sources)
    spawn_s: float = 0.0  # total time spent starting sandboxes
    reset_s: float = 0.0  # total time spent resetting them
    idle: int = 0
    lent: int = 0
    live: int = 0  # every sandbox that exists: idle, lent, starting, resetting

    @property
    def mean_spawn_ms(self) -> float:
        return 1e3 * self.spawn_s / self.spawned if self.spawned else 0.0

    @property
    def mean_reset_ms(self) -> float:
        return 1e3 * self.reset_s / self.resets if self.resets else 0.0


@dataclass
class _Counts:
    spawned: int = 0
    reused: int = 0
    evicted: int = 0
    resets: int = 0
    reset_failures: int = 0
    waits: int = 0
    spawn_s: float = 0.0
    reset_s: float = 0.0


def sources_digest(sources: dict[str, str]) -> str:
    """What identifies a sandbox's contents: the tool names and their sources (in any order)."""
    h = hashlib.sha256()
    for name in sorted(sources):
        for part in (name, sources[name]):
            data = part.encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


class PooledEnvironment(ArenaEnvironment):
    """An :class:`ArenaEnvironment` over a sandbox lent by a :class:`SandboxPool`: the same
    tools, calls (load errors included) and ``reset()``; ``close()`` gives the sandbox back to
    the pool instead of stopping it. Using it after that is a :class:`SandboxPoolError`."""

    def __init__(self, task: ArenaTask, sandbox: Sandbox, pool: SandboxPool, key: str) -> None:
        # Not ArenaEnvironment.__init__, which creates a sandbox of its own.
        self.task = task
        self.sandbox = sandbox
        self.key = key
        self._pool = pool
        self._returned = False

    def _check(self) -> None:
        if self._returned or self._pool.closed:
            what = "its pool is closed" if self._pool.closed else "it was given back"
            raise SandboxPoolError(
                f"the environment of task {self.task.task_id} cannot be used: {what}",
                hint="use it only inside `async with pool.environment(task) as env:`",
            )

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self._check()
        return await super().call_tool(name, arguments)

    async def reset(self) -> None:
        self._check()
        await super().reset()

    async def close(self) -> None:
        """Give the sandbox back (it is reset before another episode gets it)."""
        if not self._returned:
            self._returned = True
            await self._pool._give_back(self.sandbox, self.key)

    async def __aenter__(self) -> Self:
        return self


async def _close(sandbox: Sandbox) -> None:
    """Close ``sandbox`` even if cancelled meanwhile: its processes are killed before the first
    suspension, and a second close only releases its uid lease (it does not suspend)."""
    try:
        await sandbox.close()
    except asyncio.CancelledError:
        await sandbox.close()
        raise


class SandboxPool:
    """Idle sandboxes keyed by their tool sources, lent as fresh environments (see the
    module). ``limits`` and ``unsafe_no_sandbox`` apply to every sandbox of the pool."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        max_idle: int = 64,
        max_live: int | None = None,
        unsafe_no_sandbox: bool = False,
    ) -> None:
        if max_idle < 0 or (max_live is not None and max_live < 1):
            raise ConfigError(
                f"invalid pool bounds: max_idle={max_idle}, max_live={max_live}",
                hint="max_idle ≥ 0 (0: no reuse); max_live ≥ 1 or None (unbounded)",
            )
        if not unsafe_no_sandbox and not bwrap_available():
            raise ConfigError(
                "bubblewrap (bwrap) is not installed, so tool code cannot be isolated",
                hint="install it (apt-get install bubblewrap), or pass unsafe_no_sandbox=True "
                "to run tool code without isolation (only for code you trust)",
            )
        self.limits = limits or SandboxLimits()
        self.max_idle = max_idle
        self.max_live = max_live
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self._idle: OrderedDict[Sandbox, str] = OrderedDict()  # least recently used first
        self._by_key: dict[str, list[Sandbox]] = {}  # idle ones per key, most recent last
        self._live: dict[Sandbox, str] = {}  # every sandbox that exists, and its key
        self._per_key: Counter[str] = Counter()  # live sandboxes per key
        self._resetting: Counter[str] = Counter()
        self._wanting: Counter[str] = Counter()  # acquires waiting, per key
        self._waiters: list[asyncio.Future[None]] = []
        self._recycling: set[asyncio.Task[None]] = set()
        self._lent = 0
        self._counts = _Counts()
        self._closed = False

    # ------------------------------------------------------------------ public

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stats(self) -> PoolStats:
        return PoolStats(
            **asdict(self._counts), idle=len(self._idle), lent=self._lent, live=len(self._live)
        )

    async def acquire(self, task: ArenaTask) -> PooledEnvironment:
        """A fresh environment for ``task`` (an idle sandbox with its sources, reset since its
        last episode, or a new one); give it back with ``close()``, or use
        :meth:`environment`. A sandbox that does not start raises (ConfigError)."""
        key = sources_digest(task.sources)
        sandbox, new = await self._checkout(task, key)
        if new:
            await self._start(sandbox)
        self._lent += 1
        log.debug("lent a %s sandbox for task %s", "new" if new else "reused", task.task_id)
        return PooledEnvironment(task, sandbox, self, key)

    @contextlib.asynccontextmanager
    async def environment(self, task: ArenaTask) -> AsyncIterator[PooledEnvironment]:
        """``async with pool.environment(task) as env:`` — acquire, and give back at exit."""
        env = await self.acquire(task)
        try:
            yield env
        finally:
            await env.close()

    async def wait_resets(self) -> None:
        """Until every sandbox given back so far has been reset (idle) or closed."""
        while self._recycling:
            await asyncio.wait(set(self._recycling))

    async def aclose(self) -> None:
        """Close every sandbox (idle, lent, starting, resetting); acquires waiting or coming
        raise :class:`SandboxPoolError`. Runs to the end even if cancelled meanwhile."""
        self._closed = True
        self._wake()
        for task in list(self._recycling):
            task.cancel()
        interrupted: asyncio.CancelledError | None = None
        while self._recycling:
            try:
                await asyncio.wait(set(self._recycling))
            except asyncio.CancelledError as exc:
                interrupted = exc
        self._idle.clear()
        self._by_key.clear()
        while self._live:
            sandbox, _ = self._live.popitem()
            try:
                await _close(sandbox)
            except asyncio.CancelledError as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ lending

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxPoolError(
                "the sandbox pool is closed",
                hint="acquire environments inside `async with SandboxPool(...) as pool:`",
            )

    async def _checkout(self, task: ArenaTask, key: str) -> tuple[Sandbox, bool]:
        """An idle sandbox of ``key`` (False), or a new one not started yet (True).

        At ``max_live``: close an idle sandbox that no waiting acquire wants (least recently
        used first); else, if ``key`` has no sandbox at all, the least recently used idle one;
        else wait (for one of ``key`` to come back, or for room). Sources in demand thus keep
        their sandboxes instead of evicting each other's: an eviction there would cost a spawn
        and gain no sandbox."""
        patient = True
        while True:
            self._check_open()
            idle = self._take_idle(key)
            if idle is not None:
                self._counts.reused += 1
                return idle, False
            if patient and self._resetting[key] > self._wanting[key]:  # ready in a few ms
                # unless its reset waits for a call the episode abandoned (up to the
                # sandbox's wall limit): then a new sandbox is quicker
                patient = await self._wait(key, RESET_WAIT_S)
                continue
            if self.max_live is None or len(self._live) < self.max_live:
                sandbox = Sandbox(
                    task.sources, self.limits, unsafe_no_sandbox=self.unsafe_no_sandbox
                )
                self._live[sandbox] = key
                self._per_key[key] += 1
                return sandbox, True
            victim = self._lru_idle(unwanted=True)
            if victim is None and not self._per_key[key]:  # none of ours comes back
                victim = self._lru_idle(unwanted=False)
            if victim is not None:
                self._evict(victim)
                await self._discard(victim)
            else:
                await self._wait(key)

    async def _start(self, sandbox: Sandbox) -> None:
        t0 = time.monotonic()
        try:
            await sandbox.start()
        except Exception:
            await self._discard(sandbox)
            self._check_open()  # closed while it started: say so, not "did not start"
            raise
        except BaseException:
            await self._discard(sandbox)
            raise
        self._counts.spawned += 1
        self._counts.spawn_s += time.monotonic() - t0
        if self._closed:  # closed right after it started
            await self._discard(sandbox)
            self._check_open()

    async def _wait(self, key: str, timeout: float | None = None) -> bool:
        """Until something changes (a sandbox given back, reset, closed; the pool closed):
        True; False if ``timeout`` passed first."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._counts.waits += 1
        self._wanting[key] += 1
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            _decrement(self._wanting, key)
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ taking back

    async def _give_back(self, sandbox: Sandbox, key: str) -> None:
        """Reset it in the background, then make it idle; or close it (pool closed, no reuse)."""
        self._lent -= 1
        if self._closed or self.max_idle == 0 or sandbox not in self._live:
            await self._discard(sandbox)
            return
        self._resetting[key] += 1
        task = asyncio.create_task(self._recycle(sandbox, key), name="sandbox-pool-reset")
        self._recycling.add(task)
        task.add_done_callback(self._recycling.discard)

    async def _recycle(self, sandbox: Sandbox, key: str) -> None:
        t0, ok = time.monotonic(), False
        try:
            await sandbox.reset()
            ok = True
        except Exception as exc:  # whatever broke, this sandbox is not trusted any more
            self._counts.reset_failures += 1
            log.warning("a pooled sandbox failed to reset (%s): closed, a new one will start", exc)
        finally:
            _decrement(self._resetting, key)
            if ok and not self._closed:
                self._counts.resets += 1
                self._counts.reset_s += time.monotonic() - t0
                await self._put_idle(sandbox, key)
            else:
                await self._discard(sandbox)

    async def _put_idle(self, sandbox: Sandbox, key: str) -> None:
        self._idle[sandbox] = key
        self._by_key.setdefault(key, []).append(sandbox)
        over = list(self._idle)[: max(0, len(self._idle) - self.max_idle)]
        for old in over:
            self._evict(old)
        self._wake()
        for old in over:
            await self._discard(old)

    def _take_idle(self, key: str) -> Sandbox | None:
        same = self._by_key.get(key)
        if not same:
            return None
        sandbox = same[-1]  # the most recently used: its pages are the likeliest in memory
        self._unidle(sandbox)
        return sandbox

    def _unidle(self, sandbox: Sandbox) -> None:
        key = self._idle.pop(sandbox)
        same = self._by_key[key]
        same.remove(sandbox)
        if not same:
            del self._by_key[key]

    def _lru_idle(self, *, unwanted: bool) -> Sandbox | None:
        """The least recently used idle sandbox (of a key no acquire waits for)."""
        for sandbox, key in self._idle.items():
            if not unwanted or not self._wanting[key]:
                return sandbox
        return None

    def _evict(self, sandbox: Sandbox) -> None:
        self._unidle(sandbox)
        self._counts.evicted += 1

    async def _discard(self, sandbox: Sandbox) -> None:
        key = self._live.pop(sandbox, None)
        if key is not None:
            _decrement(self._per_key, key)
        self._wake()
        await _close(sandbox)


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
