"""Readers for ``astra-train data sft``: every input format → one :class:`Candidate` per record.

Formats, detected per record (extra fields are tolerated everywhere):

* ``trajectory`` — our :class:`~astra_agent.trajectory.Trajectory` JSONL (``astra-agent run
  --save``, synthesis);
* ``arenas`` / ``bfcl`` — eval results records that embed a trajectory (``astra-eval arenas`` /
  ``bfcl`` ``results.jsonl``); the arena ``reward`` (BFCL: ``valid`` as 1/0) is the reward;
* ``astra-sft-1k`` — ASTRA-SFT-1k records: ``trajectory`` a message list (or its JSON text) in
  which a call is an assistant message of its own with ``function_call`` and its result a
  ``function`` message, the tools in ``mcp_info`` (``base_info.tool_list``); what is not used is
  counted per field;
* ``openai`` — plain ``{"messages", "tools"}`` rows.

Files are JSONL, JSON (a list of records) or parquet. A record of none of these shapes is a
:class:`~astra_agent.errors.ConfigError` naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from astra_agent.errors import ConfigError
from astra_agent.trajectory import Trajectory

ASTRA_USED = {"trajectory", "mcp_info", "id", "reward", "tools", "messages"}
ASTRA_MESSAGE_KEYS = {"role", "content", "reasoning_content", "function_call", "name", "tool_calls"}


@dataclass(frozen=True)
class Candidate:
    """One input record in the common shape, before any filter."""

    file: str
    line: int
    source: str  # trajectory | arenas | bfcl | astra-sft-1k | openai
    record_id: str
    messages: list[dict[str, Any]]
    offers: list[tuple[int, list[dict[str, Any]]]]  # (from message index, tools offered)
    termination: str | None = None
    reward: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # kept in provenance
    unused: tuple[str, ...] = ()  # fields this reader could not use

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.offers[0][1] if self.offers else []

    def tools_at(self, index: int) -> list[dict[str, Any]]:
        """The tools offered when ``messages[index]`` was reached."""
        current: list[dict[str, Any]] = []
        for at, tools in self.offers:
            if at > index:
                break
            current = tools
        return current


@dataclass(frozen=True)
class Unreadable:
    """A line that cannot be read (a torn last line of a killed writer)."""

    file: str
    line: int
    detail: str


def tool_name(schema: dict[str, Any]) -> str:
    fn = schema.get("function", schema)
    return str(fn.get("name", "")) if isinstance(fn, dict) else ""


def _json_field(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _from_trajectory(traj: Trajectory, file: str, line: int, source: str) -> Candidate:
    offers = [(0, list(traj.tools))]
    offers += [(c.at_message, traj.tools_at(c.at_message)) for c in traj.tool_changes]
    return Candidate(
        file=file,
        line=line,
        source=source,
        record_id=traj.id,
        messages=list(traj.messages),
        offers=offers,
        termination=traj.termination,
        meta={"model": traj.model} if traj.model else {},
    )


def _eval_record(rec: dict[str, Any], file: str, line: int) -> Candidate:
    source = "arenas" if "reward" in rec else "bfcl"
    traj_data = rec.get("trajectory")
    rec_id = str(rec.get("id", f"{Path(file).name}:{line}"))
    if traj_data is None:  # an entry that failed to run
        return Candidate(
            file,
            line,
            source,
            rec_id,
            [],
            [],
            termination="error",
            meta={"error": rec.get("error") or ""},
        )
    traj = Trajectory.model_validate(traj_data)
    cand = _from_trajectory(traj, file, line, source)
    reward = _reward(rec)
    if source == "bfcl" and isinstance(rec.get("valid"), bool):
        reward = 1.0 if rec["valid"] else 0.0
    meta: dict[str, Any] = {**cand.meta}
    meta.update({k: rec[k] for k in ("task_id", "domain", "category") if k in rec})
    return Candidate(
        cand.file,
        line,
        source,
        rec_id,
        cand.messages,
        cand.offers,
        termination=cand.termination,
        reward=reward,
        meta=meta,
    )


def _astra_tools(rec: dict[str, Any]) -> list[dict[str, Any]]:
    tools = _json_field(rec.get("tools"))
    if isinstance(tools, list) and tools:
        return [t for t in tools if isinstance(t, dict)]
    mcp = _json_field(rec.get("mcp_info"))
    listed = (
        ((mcp or {}).get("base_info") or {}).get("tool_list") if isinstance(mcp, dict) else None
    )
    out = []
    for t in listed or []:
        if isinstance(t, dict) and t.get("name"):
            fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
            out.append({"type": "function", "function": fn})
    return out


def _astra_messages(raw: list[Any]) -> tuple[list[dict[str, Any]], set[str]]:
    """Merge each call-only assistant message into the assistant message before it; map
    ``function``/``observation`` results to ``tool``."""
    out: list[dict[str, Any]] = []
    unused: set[str] = set()
    for m in raw:
        if not isinstance(m, dict):
            out.append({"role": None, "content": m})
            continue
        unused |= {f"message.{k}" for k in m if k not in ASTRA_MESSAGE_KEYS}
        role = m.get("role")
        fc = m.get("function_call")
        if role == "assistant" and isinstance(fc, dict):
            call = {
                "type": "function",
                "function": {"name": fc.get("name"), "arguments": fc.get("arguments", "{}")},
            }
            prev = out[-1] if out and out[-1].get("role") == "assistant" else None
            if prev is None or (m.get("content") and prev.get("tool_calls")):
                prev = {"role": "assistant", "content": m.get("content") or ""}
                out.append(prev)
            prev.setdefault("tool_calls", []).append(call)
        elif role in ("function", "observation", "tool"):
            out.append(
                {
                    "role": "tool",
                    "content": m.get("content") or "",
                    **({"name": m["name"]} if m.get("name") else {}),
                }
            )
        else:
            keep = {
                k: m[k] for k in ("role", "content", "reasoning_content", "tool_calls") if k in m
            }
            out.append(keep)
    return out, unused


def _astra_record(rec: dict[str, Any], file: str, line: int) -> Candidate:
    raw = _json_field(rec.get("trajectory", rec.get("messages")))
    if not isinstance(raw, list):
        raise ConfigError(f"{file}:{line}: an ASTRA-SFT-1k record whose trajectory is not a list")
    messages, unused = _astra_messages(raw)
    unused |= {k for k in rec if k not in ASTRA_USED}
    return Candidate(
        file=file,
        line=line,
        source="astra-sft-1k",
        record_id=str(rec.get("id", f"{Path(file).name}:{line}")),
        messages=messages,
        offers=[(0, _astra_tools(rec))],
        reward=_reward(rec),
        unused=tuple(sorted(unused)),
    )


def _reward(rec: dict[str, Any]) -> float | None:
    """The record's reward where it carries a number."""
    reward = rec.get("reward")
    return float(reward) if isinstance(reward, int | float) else None


def _openai_record(rec: dict[str, Any], file: str, line: int) -> Candidate:
    tools = _json_field(rec.get("tools")) or []
    messages = _json_field(rec["messages"])
    if not isinstance(messages, list) or not isinstance(tools, list):
        raise ConfigError(f"{file}:{line}: `messages` and `tools` must be lists")
    return Candidate(
        file=file,
        line=line,
        source="openai",
        record_id=str(rec.get("id", f"{Path(file).name}:{line}")),
        messages=messages,
        offers=[(0, tools)],
        reward=_reward(rec),
    )


def candidate(rec: Any, file: str, line: int) -> Candidate:
    """The record in the common shape (ConfigError: not a record of any known format)."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{file}:{line} is not a JSON object", hint=FORMATS_HINT)
    try:
        if isinstance(rec.get("trajectory"), dict) or (
            "trajectory" in rec and rec["trajectory"] is None and "id" in rec
        ):
            return _eval_record(rec, file, line)
        if "mcp_info" in rec or isinstance(rec.get("trajectory"), list | str):
            return _astra_record(rec, file, line)
        if "messages" in rec and "termination" in rec:
            return _from_trajectory(Trajectory.model_validate(rec), file, line, "trajectory")
        if "messages" in rec:
            return _openai_record(rec, file, line)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{file}:{line}: invalid record ({where}: {first['msg']})") from exc
    keys = ", ".join(sorted(rec)[:8])
    raise ConfigError(
        f"{file}:{line} is not a record of a known format (keys: {keys})", hint=FORMATS_HINT
    )


FORMATS_HINT = (
    "inputs are Trajectory JSONL (astra-agent run --save), astra-eval results.jsonl, "
    "ASTRA-SFT-1k (JSONL/parquet) or OpenAI {messages, tools} rows"
)


def _raw_records(path: Path) -> Iterator[tuple[int, Any] | Unreadable]:
    """(line number, parsed record), or Unreadable for a torn last line."""
    name = str(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a non-parquet file
            raise ConfigError(f"{name} is not a readable parquet file: {exc}") from exc
        yield from enumerate(rows, start=1)
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}:{exc.lineno} is not valid JSON: {exc.msg}") from exc
        yield from enumerate(data if isinstance(data, list) else [data], start=1)
        return
    lines = text.split("\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except ValueError as exc:
            if i == len(lines) and not text.endswith("\n"):
                yield Unreadable(name, i, f"torn last line: {exc}")
                return
            raise ConfigError(f"{name}:{i} is not a JSON line: {exc}", hint=FORMATS_HINT) from exc


def read_inputs(paths: list[Path]) -> list[Candidate | Unreadable]:
    """Every record of every input, in order (ConfigError on a file that is neither format)."""
    out: list[Candidate | Unreadable] = []
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"input {path} not found")
        for item in _raw_records(path):
            out.append(
                item if isinstance(item, Unreadable) else candidate(item[1], str(path), item[0])
            )
    return out
