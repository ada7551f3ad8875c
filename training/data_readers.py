"""Readers for ``astra-train data sft``: every input format → one :class:`Candidate` per record.

Formats, detected per record (extra fields are tolerated everywhere):

* ``trajectory`` — our :class:`~astra_agent.trajectory.Trajectory` JSONL (``astra-agent run
  --save``, synthesis);
* ``arenas`` / ``bfcl`` / ``tau2`` — eval results records that embed a trajectory
  (``astra-eval arenas`` / ``bfcl`` / ``tau2`` ``results.jsonl``); the arena and τ² ``reward``
  (BFCL: ``valid`` as 1/0) is the reward (τ²: the agent's side of the conversation, the user
  simulator's turns as its user messages);
* ``astra-sft-1k`` — ASTRA-SFT-1k records: ``trajectory`` a message list (or its JSON text) in
  which a call is an assistant message of its own with ``function_call`` and its result a
  ``function`` message, the tools in ``mcp_info`` (``base_info.tool_list``); what is not used is
  counted per field;
* ``openai`` — plain ``{"messages", "tools"}`` rows.

Files are JSONL, JSON (a list of records) or parquet. A file that cannot be read as a whole (a
``.json`` that is not JSON, a ``.parquet`` that is not parquet) is a
:class:`~astra_agent.errors.ConfigError`; everything else that is wrong with one record is an
:class:`Unreadable` with a reason, and the other records go on:

``invalid_json`` a line that is not JSON (or nests deeper than the parser goes, or holds an
integer of more than 4,300 digits); ``undecodable`` a line that is not UTF-8; ``line_too_long``
a line of more than :data:`MAX_LINE_BYTES` (skipped: never more of it is in memory);
``invalid_value`` a lone surrogate (``"\\ud800"``: not Unicode, so it cannot be tokenized or
written), a non-finite number (``NaN``, ``Infinity``, ``1e400``) or nesting deeper than
:data:`MAX_DEPTH`; ``unknown_format`` a record of none of the formats above; ``invalid_record`` /
``invalid_messages`` / ``invalid_tools`` a record of a known format whose fields have the wrong
types; ``invalid_reward`` a reward that is not a finite number; ``torn_line`` a last line cut
short (a killed writer).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from astra_agent.errors import ConfigError
from astra_agent.trajectory import Trajectory
from training.data_schema import tools_problem

# A JSONL line longer than this is skipped unread (``line_too_long``). Not derived from
# ``max_length``: a record's line also holds what is never rendered (events, metadata, earlier
# turns' reasoning, JSON escapes of up to 12 bytes a character), so no length of a line follows
# from the length of its conversations; 64 MiB is hundreds of times a conversation of 20,480
# tokens (~100 KB of text) and keeps the parsed record's memory to a few hundred MB.
MAX_LINE_BYTES = 64 << 20
# Deeper JSON is ``invalid_value``: a trajectory record with tool schemas nests ~15 deep.
MAX_DEPTH = 100
_SURROGATE = re.compile(r"[\ud800-\udfff]")

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
    """A record that cannot be read into a :class:`Candidate` (``reason``: see the module)."""

    file: str
    line: int
    detail: str
    reason: str = "torn_line"


class BadRecord(Exception):
    """One record is unreadable (control flow inside the readers only)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail[:300]


def _where(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "the record"


def check_value(value: Any) -> None:
    """BadRecord (``invalid_value``) if ``value`` holds a lone surrogate (in a key or a string),
    a non-finite float or nesting deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            bad = _SURROGATE.search(v)
            if bad:
                raise BadRecord(
                    "invalid_value",
                    f"{_where(path)}: lone surrogate {bad.group()!a} at character "
                    f"{bad.start()} (not Unicode)",
                )
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise BadRecord("invalid_value", f"{_where(path)}: {v} is not a finite number")
        elif isinstance(v, dict | list):
            if len(path) >= MAX_DEPTH:
                raise BadRecord("invalid_value", f"nested deeper than {MAX_DEPTH} levels")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str) and _SURROGATE.search(k):
                    raise BadRecord(
                        "invalid_value", f"{_where(path)}: a key holds a lone surrogate"
                    )
                stack.append((x, (*path, k)))


def load_json(text: str | bytes) -> Any:
    """``json.loads`` of one record; BadRecord (``invalid_json``) where it fails, also for
    nesting deeper than the parser goes and integers of more than 4,300 digits."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRecord("invalid_json", "nested too deeply to parse") from None
    except json.JSONDecodeError as exc:
        raise BadRecord("invalid_json", str(exc)[:200]) from None
    except ValueError:  # int() refuses to parse more than 4,300 digits
        raise BadRecord("invalid_json", "an integer of more than 4,300 digits") from None


def tool_name(schema: dict[str, Any]) -> str:
    fn = schema.get("function", schema)
    return str(fn.get("name", "")) if isinstance(fn, dict) else ""


def _json_field(value: Any) -> Any:
    """A field that may hold JSON text (ASTRA-SFT-1k), parsed; text that is not JSON stays."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except RecursionError:
            raise BadRecord("invalid_json", "a JSON field nested too deeply to parse") from None
        except ValueError:
            return value
        check_value(parsed)
        return parsed
    return value


def _from_trajectory(traj: Trajectory, file: str, line: int, source: str) -> Candidate:
    for tools in [traj.tools, *(c.schemas for c in traj.tool_changes)]:
        problem = tools_problem(tools)  # before tools_at reads their names
        if problem:
            raise BadRecord(*problem)
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
    source = "tau2" if "user_side" in rec else "arenas" if "reward" in rec else "bfcl"
    traj_data = rec.get("trajectory")
    rec_id = _record_id(rec, file, line)
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
    meta.update({k: rec[k] for k in ("task_id", "domain", "category", "trial") if k in rec})
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
    info = mcp.get("base_info") if isinstance(mcp, dict) else None
    listed = info.get("tool_list") if isinstance(info, dict) else None
    out = []
    for t in listed if isinstance(listed, list) else []:
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
        raise BadRecord("invalid_record", "an ASTRA-SFT-1k record whose trajectory is not a list")
    messages, unused = _astra_messages(raw)
    unused |= {k for k in rec if k not in ASTRA_USED}
    tools = _astra_tools(rec)
    return _one_offer(rec, file, line, "astra-sft-1k", messages, tools, tuple(sorted(unused)))


def _record_id(rec: dict[str, Any], file: str, line: int) -> str:
    """The record's own id, else ``FILE:LINE``."""
    return str(rec.get("id", f"{Path(file).name}:{line}"))


def _one_offer(
    rec: dict[str, Any],
    file: str,
    line: int,
    source: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    unused: tuple[str, ...] = (),
) -> Candidate:
    """A record whose tools are offered once for the whole conversation, with its own id and
    reward."""
    return Candidate(
        file=file,
        line=line,
        source=source,
        record_id=_record_id(rec, file, line),
        messages=messages,
        offers=[(0, tools)],
        reward=_reward(rec),
        unused=unused,
    )


def _reward(rec: dict[str, Any]) -> float | None:
    """The record's reward (None: it carries none); BadRecord if it is not a finite number."""
    reward = rec.get("reward")
    if reward is None:
        return None
    if isinstance(reward, int | float):  # bool included: True is 1.0
        try:
            value = float(reward)
        except OverflowError:
            value = math.inf
        if math.isfinite(value):
            return value
    raise BadRecord("invalid_reward", f"reward {str(reward)[:50]!r} is not a finite number")


def _openai_record(rec: dict[str, Any], file: str, line: int) -> Candidate:
    tools = _json_field(rec.get("tools")) or []
    messages = _json_field(rec["messages"])
    if not isinstance(messages, list):
        raise BadRecord("invalid_messages", "`messages` is not a list")
    if not isinstance(tools, list):
        raise BadRecord("invalid_tools", "`tools` is not a list")
    return _one_offer(rec, file, line, "openai", messages, tools)


def _validation_reason(exc: ValidationError) -> BadRecord:
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"]]
    field = loc[0] if loc else ""
    reason = {"messages": "invalid_messages", "tools": "invalid_tools"}.get(field, "invalid_record")
    return BadRecord(reason, f"{'.'.join(loc)}: {first['msg']}"[:200])


def _candidate(rec: Any, file: str, line: int) -> Candidate:
    if not isinstance(rec, dict):
        raise BadRecord("unknown_format", f"a JSON {type(rec).__name__}, not an object")
    check_value(rec)
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
        raise _validation_reason(exc) from None
    keys = ", ".join(sorted(rec)[:8])
    raise BadRecord("unknown_format", f"not a record of a known format (keys: {keys[:150]})")


def candidate(rec: Any, file: str, line: int) -> Candidate | Unreadable:
    """The record in the common shape, or why it cannot be read (:class:`Unreadable`)."""
    try:
        return _candidate(rec, file, line)
    except BadRecord as bad:
        return Unreadable(file, line, bad.detail, bad.reason)


FORMATS_HINT = (
    "inputs are Trajectory JSONL (astra-agent run --save), astra-eval results.jsonl, "
    "ASTRA-SFT-1k (JSONL/parquet) or OpenAI {messages, tools} rows"
)


def _lines(path: Path) -> Iterator[tuple[int, bytes | None, bool]]:
    """(line number, the line's bytes without its newline — None if longer than
    :data:`MAX_LINE_BYTES`, whether a newline ended it) of a JSONL file."""
    limit = MAX_LINE_BYTES
    with path.open("rb") as f:
        number = 0
        while raw := f.readline(limit + 1):
            number += 1
            if raw.endswith(b"\n"):
                yield number, raw[:-1], True
            elif len(raw) <= limit:
                yield number, raw, False  # the last line, without a newline
            else:
                while raw and not raw.endswith(b"\n"):  # skip the rest, a MiB at a time
                    raw = f.readline(1 << 20)
                yield number, None, bool(raw)


def _jsonl_records(path: Path) -> Iterator[tuple[int, Any] | Unreadable]:
    name = str(path)
    for number, raw, ended in _lines(path):
        if raw is None:
            detail = f"longer than {MAX_LINE_BYTES} bytes"
            yield Unreadable(name, number, detail, "line_too_long")
            continue
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            text = raw.decode("utf-8")
            if not text.strip():
                continue
            yield number, load_json(text)
        except (UnicodeDecodeError, BadRecord) as exc:
            if isinstance(exc, UnicodeDecodeError):
                reason, detail = "undecodable", f"byte {exc.start}: not UTF-8 ({exc.reason})"
            else:
                reason, detail = exc.reason, exc.detail
            if not ended:  # a killed writer's last line
                yield Unreadable(name, number, f"torn last line: {detail}")
            else:
                yield Unreadable(name, number, detail, reason)


def _raw_records(path: Path) -> Iterator[tuple[int, Any] | Unreadable]:
    """(line number, parsed record), or Unreadable for a line that cannot be parsed."""
    name = str(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a non-parquet file
            raise ConfigError(f"{name} is not a readable parquet file: {exc}") from exc
        yield from enumerate(rows, start=1)
        return
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_bytes().decode("utf-8-sig"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{name}: byte {exc.start} is not UTF-8 ({exc.reason})") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}:{exc.lineno} is not valid JSON: {exc.msg}") from exc
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{name} cannot be parsed as JSON: {str(exc)[:200]}") from None
        yield from enumerate(data if isinstance(data, list) else [data], start=1)
        return
    yield from _jsonl_records(path)


def read_inputs(paths: list[Path]) -> list[Candidate | Unreadable]:
    """Every record of every input, in order (ConfigError on a file that cannot be read)."""
    out: list[Candidate | Unreadable] = []
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"input {path} not found")
        for item in _raw_records(path):
            out.append(
                item if isinstance(item, Unreadable) else candidate(item[1], str(path), item[0])
            )
    return out
