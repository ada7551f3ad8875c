"""Build the arena set (ASTRA-RL-1k records plus task_id / domain / reference) from the data
files beside this script: train.jsonl and heldout.jsonl, byte for byte the same on every run.

    .venv/bin/python -m eval.arenas.data.build           # from the repository root: write both
    .venv/bin/python -m eval.arenas.data.build --check   # rebuild, compare, write nothing

Layout of the data files and how to add a task: README.md here. Gold answers written as
``{from: TOOL.FIELD}`` (codes that tools mint) and arguments taken from earlier outputs are
filled in by running the reference chain in ``astra_agent.arena.ArenaEnvironment`` (the
bubblewrap sandbox, as in RL); every task then passes the self-check (``check_task``, the
loader's ``parse_record``, and ``run_reference`` solving every sub-question) before anything
is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from astra_agent.arena import AnswerMatch, ArenaEnvironment, ArenaTask, parse_record, run_reference
from astra_agent.environment import ToolSpec
from astra_agent.errors import ConfigError
from eval.arenas.data.specs import Pool, Ref, TaskSpec, load_pool, task_specs, validated

HERE = Path(__file__).resolve().parent
SPLITS = ("train", "heldout")
MATCH = AnswerMatch()  # the reward's matcher: a gold answer counts iff the reward sees it
BOGUS = {"string": "ZZ-404", "integer": 1, "number": 1.5, "boolean": True}
MAX_BYTES = 1_000_000


def _lookup(ref: str, outputs: dict[str, Any]) -> Any:
    tool, _, path = ref.partition(".")
    if tool not in outputs:
        raise ConfigError(f"{{from: {ref}}}: {tool} has not been called yet")
    value = outputs[tool]
    for key in path.split(".") if path else []:
        try:
            value = value[int(key)] if isinstance(value, list) else value[key]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ConfigError(f"{{from: {ref}}}: no {key!r} in {tool}'s output") from None
    return value


def resolve(value: Any, outputs: dict[str, Any]) -> Any:
    """``{from: TOOL.FIELD}`` -> that field of TOOL's output in this chain; else the value."""
    if isinstance(value, dict) and set(value) == {"from"}:
        value = validated(Ref, value, "argument")
    return _lookup(value.from_, outputs) if isinstance(value, Ref) else value


def _draft(spec: TaskSpec, domain: str, pool: Pool) -> ArenaTask:
    chain = [step.tool for step in spec.chain]
    distractors = spec.distractors
    need(not set(chain) & set(distractors), "a chain tool is listed as a distractor")
    names = sorted(chain + distractors)  # sorted: the listing does not reveal the order
    missing = [n for n in names if n not in pool]
    if missing:
        raise ConfigError(f"unknown tool(s) {missing} (not in {domain}/tools.yaml)")
    return ArenaTask(
        index=0,
        task_id=spec.id,
        prompt=[{"role": "user", "content": spec.prompt}],
        tools=[ToolSpec.from_openai(pool[n][0]) for n in names],
        sources={n: pool[n][1] for n in names},
        sub_qa={},
        domain=domain,
    )


async def _run_chain(
    spec: TaskSpec, env: ArenaEnvironment
) -> tuple[list[dict[str, Any]], dict[str, list[str]], list[str]]:
    """Run the chain, filling in references: (reference, sub_qa, output texts)."""
    reference: list[dict[str, Any]] = []
    sub_qa: dict[str, list[str]] = {}
    texts: list[str] = []
    outputs: dict[str, Any] = {}  # tool -> the value it returned
    for step in spec.chain:
        name = step.tool
        args = {k: resolve(v, outputs) for k, v in step.arguments.items()}
        result = await env.call_tool(name, args)
        if result.is_error or "error" in result.text.lower()[:12]:
            raise ConfigError(f"{name}({args}) returned an error: {result.text}")
        outputs[name] = result.structured
        golds = step.gold if isinstance(step.gold, list) else [step.gold]
        sub_qa[name] = [str(resolve(g, outputs)) for g in golds]
        reference.append({"name": name, "arguments": args})
        texts.append(result.text)
    return reference, sub_qa, texts


async def _robust(task: ArenaTask, env: ArenaEnvironment) -> None:
    """Bogus (well-typed) arguments must give an error value, never an exception."""
    for tool in task.tools:
        props, required = tool.parameters["properties"], tool.parameters["required"]
        args = {p: BOGUS[d["type"]] for p, d in props.items() if p in required}
        result = await env.call_tool(tool.name, args)
        if result.is_error or not isinstance(result.structured, str | dict | list):
            raise ConfigError(f"{tool.name}(**{args}) gave {result.text[:200]!r}")


def check_task(task: ArenaTask, texts: list[str]) -> None:
    """The rules every task keeps (beyond the loader's): see README.md, 'Rules'."""
    assert task.reference is not None
    ptext, n_distract = task.prompt[0]["content"], len(task.tools) - len(task.sub_qa)
    need(2 <= len(task.reference) <= 5, f"chain length {len(task.reference)}")
    need(len(task.sub_qa) == len(task.reference), "each chain tool may be called only once")
    need(1 <= n_distract <= 3, f"{n_distract} distractors (1-3; a chain tool is no distractor)")
    schemas = {t.name: t.parameters for t in task.tools}
    for i, (call, text) in enumerate(zip(task.reference, texts, strict=True)):
        name, args, golds = call["name"], call["arguments"], task.sub_qa[call["name"]]
        params = schemas[name]
        need(
            set(params["required"]) <= set(args) <= set(params["properties"]),
            f"{name} arguments {sorted(args)} do not fit its schema",
        )
        need(any(MATCH.found(g, text) for g in golds), f"{name} output {text!r} lacks {golds}")
        for g in golds:
            need(len(g.strip()) >= 3, f"gold {g!r} too short")
            need(not MATCH.found(g, ptext), f"gold {g!r} appears in the prompt")
            need(
                not any(MATCH.found(g, o) for o in texts[:i]),
                f"gold {g!r} of {name} already appears in an earlier output",
            )
        if i:
            linked = [str(v) for v in args.values() if str(v) in "\n".join(texts[:i])]
            need(bool(linked), f"{name}: no argument comes from an earlier output")
            need(
                any(not MATCH.found(v, ptext) for v in linked),
                f"{name}: its linking value(s) {linked} appear in the prompt",
            )


def need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


async def build_record(spec: TaskSpec, domain: str, pool: Pool, unsafe: bool) -> dict[str, Any]:
    """One task -> its JSONL record, after the self-check passed."""
    draft = _draft(spec, domain, pool)
    async with ArenaEnvironment(draft, unsafe_no_sandbox=unsafe) as env:
        need(not env.sandbox.load_errors, f"tools do not load: {env.sandbox.load_errors}")
        reference, sub_qa, texts = await _run_chain(spec, env)
        rec = {
            "prompt": draft.prompt,
            "tool_schema": json.dumps([pool[t.name][0] for t in draft.tools], ensure_ascii=False),
            "tool_dict": json.dumps(draft.sources, ensure_ascii=False),
            "sub_qa_dict": json.dumps(sub_qa, ensure_ascii=False),
            "task_id": spec.id,
            "domain": domain,
            "reference": reference,
        }
        task, problems = parse_record(rec, 0)
        need(task is not None and not problems, "; ".join(map(str, problems)))
        assert task is not None
        check_task(task, texts)
        await env.reset()
        reward, replayed = await run_reference(task, env)
        need(reward.fully_solved, f"the reference chain solves only {list(reward.solved)}")
        need(replayed == texts, "tool outputs differ between two runs (not deterministic)")
        await _robust(task, env)
    return rec


async def build_async(data: Path, unsafe: bool) -> dict[str, str]:
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    pools: dict[str, Pool] = {}
    ids: set[str] = set()
    prompts: set[str] = set()
    for n, (domain, raw) in enumerate(task_specs(data), 1):
        tid = str(raw.get("id") if isinstance(raw, dict) else f"entry {n}")
        try:
            spec = validated(TaskSpec, raw, "task")
            need(spec.id.startswith(domain + "-") and spec.id not in ids, "id unprefixed or reused")
            need(spec.prompt not in prompts, "the same prompt as another task")
            if domain not in pools:
                pools[domain] = load_pool(data, domain)
            rec = await build_record(spec, domain, pools[domain], unsafe)
        except ConfigError as exc:
            raise ConfigError(f"SELF-CHECK FAILED [{domain}: {tid}]: {exc.message}") from exc
        ids.add(spec.id)
        prompts.add(spec.prompt)
        splits[spec.split].append(rec)
    blobs = {
        f"{s}.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
        for s, recs in splits.items()
    }
    size = sum(len(b.encode()) for b in blobs.values())
    need(size < MAX_BYTES, f"SELF-CHECK FAILED: output is {size} bytes")
    return blobs


def build(data: Path = HERE, *, unsafe_no_sandbox: bool = False) -> dict[str, str]:
    """File name -> JSONL text, self-checked; raises ConfigError naming the failing task."""
    if unsafe_no_sandbox:  # asked for, for our own tool code: the warning is noise here
        logging.getLogger("astra_agent.sandbox").setLevel(logging.ERROR)
    return asyncio.run(build_async(data, unsafe_no_sandbox))


def _same(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=HERE, help="data directory (default: here)")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: --data)")
    ap.add_argument("--check", action="store_true", help="compare with the files, write none")
    ap.add_argument(
        "--unsafe-no-sandbox", action="store_true", help="run the tool code without bubblewrap"
    )
    args = ap.parse_args(argv)
    out = args.out or args.data
    try:
        blobs = build(args.data, unsafe_no_sandbox=args.unsafe_no_sandbox)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.check:
        stale = [f for f, b in blobs.items() if not _same(out / f, b)]
        print(f"stale: {', '.join(stale)} (rebuild)" if stale else "ok: up to date")
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for fname, blob in blobs.items():
        (out / fname).write_text(blob, encoding="utf-8")
    n = {f: b.count("\n") for f, b in blobs.items()}
    print(f"ok: {n} tasks, {sum(len(b.encode()) for b in blobs.values())} bytes, in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
