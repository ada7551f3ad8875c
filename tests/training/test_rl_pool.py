"""Pooled arena sandboxes (training.rl.pool): reuse, fresh state after reuse, bounds, faults,
and nothing left running after close."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest

from astra_agent.arena import ArenaEnvironment, ArenaTask
from astra_agent.environment import ToolSpec
from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ConfigError
from astra_agent.model import ModelTurn, ToolCall
from astra_agent.procs import descendants
from astra_agent.sandbox import SandboxLimits, bwrap_available
from training.rl.pool import PoolStats, SandboxPool, SandboxPoolError, sources_digest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not bwrap_available(), reason="the pool's sandboxes need bubblewrap"),
]

LIMITS = SandboxLimits(wall_seconds_per_call=1.5, cpu_seconds_per_call=2)

POLLUTE = (
    "import math, os, threading, time\n"
    "SEEN = []\n"
    "def pollute():\n"
    "    SEEN.append(1)\n"
    "    open('/tmp/leftover', 'w').write('secret')\n"
    "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "    math.tau = 'patched'\n"
    "    os.environ['POLLUTED'] = '1'\n"
    "    return len(SEEN)\n"
)
PROBE = (
    "import math, os\n"
    "def probe():\n"
    "    return {'tmp': sorted(os.listdir('/tmp')), 'tau': math.tau,\n"
    "            'env': os.environ.get('POLLUTED'),\n"
    "            'threads': len(os.listdir('/proc/self/task'))}\n"
)
ECHO = "def echo(text='x'):\n    return {'echo': text}\n"
FAULTS = {
    "hang": ("import time\ndef hang():\n    time.sleep(30)\n", "timed out"),
    "exit": ("import os\ndef exit():\n    os._exit(3)\n", "crashed"),
    "kill_self": (
        "import os\ndef kill_self():\n    os.kill(os.getpid(), 9)\n",
        "sending signals is not allowed",  # the audit hook refuses it first
    ),
    "raise_kill": (
        "import signal\ndef raise_kill():\n    signal.raise_signal(signal.SIGKILL)\n",
        "crashed",  # the reason may name an earlier pid of the episode (see the report)
    ),
}


def make_task(sources: dict[str, str], task_id: str = "t") -> ArenaTask:
    tools = [ToolSpec(name) for name in sources]
    return ArenaTask(
        index=0,
        task_id=task_id,
        prompt=[{"role": "user", "content": "go"}],
        tools=tools,
        sources=sources,
        sub_qa={name: ["x"] for name in sources},
    )


STATEFUL = make_task({"pollute": POLLUTE, "probe": PROBE})


async def call(env: ArenaEnvironment, name: str, **args: Any) -> Any:
    result = await env.call_tool(name, args)
    assert not result.is_error, result.text
    return result.structured


def ours(before: set[int]) -> list[int]:
    """This test's live descendants: those that were not already running when it started
    (session fixtures of the whole suite, e.g. a vLLM server, are descendants too)."""
    return [p for p in descendants(os.getpid()) if p not in before]


async def no_descendants(before: set[int], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := ours(before)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not left, f"processes left behind: {left}"


async def test_reuse_spawns_nothing_the_second_time() -> None:
    async with SandboxPool(LIMITS) as pool:
        async with pool.environment(STATEFUL) as env:
            first = env.sandbox
            await call(env, "probe")
        again = make_task(STATEFUL.sources, "same-sources-other-task")
        async with pool.environment(again) as env:
            assert env.sandbox is first and env.task is again
            await call(env, "probe")
        stats = pool.stats
        assert (stats.spawned, stats.reused, stats.resets) == (1, 1, 1), stats
        assert stats.reset_failures == 0 and stats.mean_reset_ms > 0


async def test_a_reused_sandbox_keeps_nothing_of_the_previous_episode() -> None:
    async with SandboxPool(LIMITS) as pool:
        async with pool.environment(STATEFUL) as env:
            pristine = await call(env, "probe")
            assert pristine["env"] is None and pristine["threads"] == 1, pristine
            assert await call(env, "pollute") == 1
            assert await call(env, "pollute") == 2  # within an episode, state persists
            polluted = await call(env, "probe")
            assert polluted["tau"] == "patched" and "leftover" in polluted["tmp"], polluted
        for _ in range(2):
            async with pool.environment(STATEFUL) as env:
                assert await call(env, "probe") == pristine  # global, file, patch: gone
                assert await call(env, "pollute") == 1
        assert pool.stats.spawned == 1 and pool.stats.reused == 2


async def test_different_sources_get_different_sandboxes() -> None:
    a, b = make_task({"echo": ECHO}, "a"), make_task({"echo": ECHO + "\n# v2\n"}, "b")
    assert sources_digest(a.sources) != sources_digest(b.sources)
    assert sources_digest({"x": "1", "y": "2"}) == sources_digest({"y": "2", "x": "1"})
    async with SandboxPool(LIMITS) as pool:
        async with pool.environment(a) as ea, pool.environment(b) as eb:
            assert ea.sandbox is not eb.sandbox
        await pool.wait_resets()
        async with pool.environment(a) as ea2, pool.environment(a) as ea3:
            again = {ea2.sandbox, ea3.sandbox}
            assert len(again) == 2 and ea.sandbox in again and eb.sandbox not in again
        assert pool.stats.spawned == 3 and pool.stats.reused == 1


async def test_lru_eviction_at_max_idle() -> None:
    tasks = [make_task({"echo": ECHO + f"# {i}\n"}, f"t{i}") for i in range(3)]
    async with SandboxPool(LIMITS, max_idle=2) as pool:
        boxes = []
        for t in tasks:
            async with pool.environment(t) as env:
                boxes.append(env.sandbox)
            await pool.wait_resets()
        assert pool.stats.idle == 2 and pool.stats.evicted == 1, pool.stats
        assert boxes[0]._proc is None  # the least recently used was closed
        async with pool.environment(tasks[1]) as env:
            assert env.sandbox is boxes[1]
        async with pool.environment(tasks[0]) as env:
            assert env.sandbox is not boxes[0]
            assert await call(env, "echo", text="back") == {"echo": "back"}
        assert pool.stats.spawned == 4 and pool.stats.live <= 3


async def test_max_live_waits_for_a_sandbox_to_come_back() -> None:
    a, b = make_task({"echo": ECHO}, "a"), make_task({"echo": ECHO + "# b\n"}, "b")
    async with SandboxPool(LIMITS, max_live=1) as pool:
        held = await pool.acquire(a)
        waiting = asyncio.create_task(pool.acquire(b))
        await asyncio.sleep(0.3)
        assert not waiting.done() and pool.stats.live == 1 and pool.stats.waits >= 1
        await held.close()
        got = await asyncio.wait_for(waiting, 10)
        assert await call(got, "echo") == {"echo": "x"}
        assert pool.stats.live == 1 and pool.stats.evicted == 1, pool.stats  # a made room
        await got.close()
        with pytest.raises(SandboxPoolError, match="given back"):
            await got.call_tool("echo", {})


async def test_many_concurrent_episodes_stay_bounded_and_fresh() -> None:
    tasks = [make_task({**STATEFUL.sources, "echo": ECHO + f"# {i}\n"}, f"t{i}") for i in range(3)]
    peak = 0

    async with SandboxPool(LIMITS, max_live=4) as pool:

        async def episode(i: int) -> int:
            nonlocal peak
            async with pool.environment(tasks[i % 3]) as env:
                peak = max(peak, pool.stats.live)
                assert (await call(env, "probe"))["env"] is None
                n = await call(env, "pollute")
                await asyncio.sleep(0.01 * (i % 4))
                return int(n)

        assert await asyncio.gather(*(episode(i) for i in range(24))) == [1] * 24
        stats = pool.stats
    assert peak <= 4 and stats.spawned + stats.reused == 24 and stats.reused >= 12, stats
    assert stats.lent == 0


class CallsModel:
    """A model that makes the given calls one per turn, then answers."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @property
    def name(self) -> str:
        return "calls"

    async def complete(self, messages: list[dict[str, Any]], *_: Any) -> ModelTurn:
        done = sum(m["role"] == "tool" for m in messages)
        if done >= len(self.calls):
            return ModelTurn("done", "", [], "stop")
        return ModelTurn("", "", [ToolCall(f"c{done}", self.calls[done], "{}")], "tool_calls")

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_tool_that_hangs_or_kills_its_worker_mid_episode(fault: str) -> None:
    source, expected = FAULTS[fault]
    task = make_task({fault: source, **STATEFUL.sources})
    async with SandboxPool(LIMITS) as pool:
        async with pool.environment(task) as env:
            traj = await run_episode(CallsModel(["pollute", fault, "probe"]), env, task.prompt)
        assert [e.status for e in traj.events] == ["ok", "tool_error", "ok"], traj.events
        assert expected in traj.messages[4]["content"], traj.messages[4]
        async with pool.environment(task) as env:  # the next episode, same sandbox
            assert await call(env, "pollute") == 1
        assert pool.stats.spawned == 1 and pool.stats.reused == 1


async def test_a_call_abandoned_by_the_episode_timeout_does_not_reach_the_next() -> None:
    task = make_task({"hang": FAULTS["hang"][0], **STATEFUL.sources})
    limits = EpisodeLimits(tool_timeout_s=0.3)  # shorter than the sandbox's own 1.5 s
    async with SandboxPool(LIMITS) as pool:
        async with pool.environment(task) as env:
            abandoned = env.sandbox
            traj = await run_episode(
                CallsModel(["pollute", "hang"]), env, task.prompt, limits=limits
            )
        assert [e.status for e in traj.events] == ["ok", "timeout"]
        t0 = time.monotonic()
        async with pool.environment(task) as env:  # its reset waits for the call: a new one
            assert time.monotonic() - t0 < LIMITS.wall_seconds_per_call
            assert env.sandbox is not abandoned and await call(env, "pollute") == 1
        await pool.wait_resets()
        async with pool.environment(task) as a, pool.environment(task) as b:
            assert abandoned in (a.sandbox, b.sandbox)  # reset once the call ended
            assert await call(a, "pollute") == 1 and await call(b, "pollute") == 1
        assert pool.stats.spawned == 2 and pool.stats.reset_failures == 0


async def test_a_failed_reset_closes_the_sandbox_and_the_next_acquire_spawns() -> None:
    async with SandboxPool(LIMITS) as pool:
        async with pool.environment(STATEFUL) as env:
            broken = env.sandbox

            async def fail() -> dict[str, str]:
                raise OSError("reset exploded")

            broken.reset = fail  # type: ignore[method-assign]
        await pool.wait_resets()
        assert pool.stats.reset_failures == 1 and pool.stats.live == 0
        assert broken._proc is None
        async with pool.environment(STATEFUL) as env:
            assert env.sandbox is not broken and await call(env, "pollute") == 1
        assert pool.stats.spawned == 2


async def test_a_tool_that_fails_to_load_leaves_the_others_working() -> None:
    bad = "raise RuntimeError('broken module')\ndef bad():\n    return 1\n"
    task = make_task({"bad": bad, "echo": ECHO})
    async with SandboxPool(LIMITS) as pool:
        for _ in range(2):  # new, then reused
            async with pool.environment(task) as env:
                assert "bad" in env.sandbox.load_errors
                r = await env.call_tool("bad", {})
                assert r.is_error and "failed to load" in r.text and "broken module" in r.text
                assert await call(env, "echo", text="ok") == {"echo": "ok"}
        assert pool.stats.reused == 1


async def test_closing_leaves_no_process_behind() -> None:
    before = set(descendants(os.getpid()))
    tasks = [make_task({"echo": ECHO + f"# {i}\n"}, f"t{i}") for i in range(3)]
    pool = SandboxPool(LIMITS)
    async with pool:
        lent = await pool.acquire(tasks[0])
        async with pool.environment(tasks[1]):
            pass  # given back: resetting or idle
        async with pool.environment(tasks[2]):
            pass
        await pool.wait_resets()
        assert pool.stats.live == 3 and ours(before)
    await no_descendants(before)
    assert pool.stats.live == 0
    with pytest.raises(SandboxPoolError, match="closed"):
        await lent.call_tool("echo", {})
    await lent.close()  # giving it back late is harmless
    with pytest.raises(SandboxPoolError, match="closed"):
        await pool.acquire(tasks[0])


async def test_cancellation_leaves_no_process_behind() -> None:
    before = set(descendants(os.getpid()))
    tasks = [make_task({"hang": FAULTS["hang"][0], "echo": ECHO + f"# {i}\n"}) for i in range(4)]

    async def rollouts() -> None:
        async with SandboxPool(LIMITS, max_live=3) as pool:

            async def episode(t: ArenaTask) -> None:
                async with pool.environment(t) as env:
                    await env.call_tool("hang", {})

            await asyncio.gather(*(episode(t) for t in tasks))  # 3 hang, 1 waits

    for delay in (0.02, 0.8):  # while sandboxes start; while calls hang and one waits
        job = asyncio.create_task(rollouts())
        await asyncio.sleep(delay)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        await no_descendants(before)


async def test_a_published_size_task_loads_and_resets_fast() -> None:
    """≈60 distractor tools, ≈100k characters of source (the published records: 38–145k)."""
    distractor = (
        "ROWS_{i} = {rows!r}\n\ndef tool_{i}(key, limit=10):\n"
        "    rows = [r for r in ROWS_{i} if r['id'] == key]\n    return rows[:limit]\n"
    )
    rows = [{"id": f"K-{n}", "v": n * 7, "tag": "padding" * 3} for n in range(30)]
    sources = {f"tool_{i}": distractor.format(i=i, rows=rows) for i in range(60)}
    task = make_task({**sources, **STATEFUL.sources})
    assert sum(map(len, task.sources.values())) > 90_000
    async with SandboxPool(LIMITS) as pool:
        for _ in range(5):
            async with pool.environment(task) as env:
                assert env.sandbox.load_errors == {}
                assert await call(env, "pollute") == 1
                assert await call(env, "tool_59", key="K-3") == [rows[3]]
        await pool.wait_resets()
        stats = pool.stats
    assert stats.spawned == 1 and stats.resets == 5
    assert stats.mean_reset_ms < 250, stats  # measured ≈10 ms here (bench/rollout.py)


def test_bounds_and_stats_are_checked() -> None:
    with pytest.raises(ConfigError, match="invalid pool bounds"):
        SandboxPool(max_idle=-1)
    with pytest.raises(ConfigError, match="invalid pool bounds"):
        SandboxPool(max_live=0)
    assert PoolStats().mean_reset_ms == 0.0 and json.dumps(PoolStats().__dict__)
