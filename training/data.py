"""``astra-train data sft``: trajectories and SFT records → one parquet both backends read.

Inputs and ``--out`` are checked before any work (a missing input, a directory given as one,
an ``--out`` that is a file or cannot be written: ConfigError). Then one bad record is one
rejection, never the end of the build: what cannot be read into a record is rejected by the
readers (:mod:`training.data_readers`: ``invalid_json``, ``undecodable``, ``line_too_long``,
``invalid_value``, ``unknown_format``, ``invalid_record``, ``invalid_reward``, ``torn_line``).
Every record read goes through the filters in order; the first that fails rejects it with a
named reason (counted in ``stats.json``, one line per rejection in ``rejections.jsonl``):

``termination:<t>`` the episode ended in ``model_error``/``length``/``empty_reply``/``error``;
``invalid_messages`` / ``invalid_tools`` fields of the wrong type, and ``misplaced_system``,
``consecutive_user``, ``consecutive_assistant``, ``unanswered_tool_call``,
``orphan_tool_result`` messages in an order no model-driven conversation has (both
:mod:`training.data_schema`); ``malformed_tool_call`` arguments that are not a JSON object (or
no name); ``unknown_tool`` a call to a tool that was not offered; ``low_reward`` below
``min_reward`` (a record without a reward is kept); then, per conversation after
:func:`split_turns`: ``duplicate`` the same messages and tools as an earlier one;
``control_text`` a string that would become control tokens (:func:`training.template.tokenize`);
``no_trained_tokens`` no assistant message after the last user query; ``too_long`` over
``max_length`` (or, with ``truncate``, no prefix ending with an assistant message fits) — found
from the rendered text's length, without tokenizing it, where it cannot fit
(:func:`training.template.text_limit`); ``template_mismatch`` the training render differs from
the serving render.

Output (written to temporary names, then renamed): ``sft.parquet`` with the columns ``id,
source, messages, tools, provenance`` (JSON strings: parquet would unify the tool schemas of
different rows into one struct and add nulls) and ``num_tokens, num_trained_tokens``;
``stats.json``; ``rejections.jsonl``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.errors import AstraError, ConfigError
from astra_agent.runio import creation_problem, file_sha256, write_atomic_with, write_text_atomic
from training.data_readers import FORMATS_HINT, Candidate, Unreadable, read_inputs, tool_name
from training.data_schema import conversation_problem
from training.template import (
    ControlTextError,
    DataError,
    Tokenized,
    TooLongError,
    check_matches_serving,
    last_query,
    load_tokenizer,
    serving_template,
    split_turns,
    tokenize,
)

FORMAT = 1
BAD_TERMINATIONS = ("model_error", "length", "empty_reply", "error")
Progress = Callable[[int, int], None]


class SFTRow(BaseModel):
    id: str
    source: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    provenance: dict[str, Any] = Field(default_factory=dict)


class DataOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokenizer: Path
    max_length: int = Field(20480, ge=16)
    overlong: Literal["drop", "truncate"] = "drop"
    min_reward: float | None = None
    split_turns: bool = True
    dedupe: bool = True

    @field_validator("min_reward")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number (nan/inf would keep every record)")
        return value


class Rejection(BaseModel):
    file: str
    line: int
    id: str
    reason: str
    detail: str = ""


class DataStats(BaseModel):
    """``stats.json``: what was built, from what, and what was rejected and why."""

    format: int = FORMAT
    fingerprint: str = ""
    inputs: list[str] = Field(default_factory=list)
    options: dict[str, Any] = Field(default_factory=dict)
    records: int = 0
    by_source: dict[str, int] = Field(default_factory=dict)  # records read per format
    conversations: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    turns: int = 0  # trained assistant messages
    tool_calls: int = 0  # in trained assistant messages
    splits: int = 0  # conversations added by splitting multi-turn records
    truncations: int = 0
    max_tokens: int = 0
    rejections: dict[str, int] = Field(default_factory=dict)
    unused_fields: dict[str, dict[str, int]] = Field(default_factory=dict)  # per format


@dataclass(frozen=True)
class _Built:
    row: SFTRow
    tokens: Tokenized


class _Reject(Exception):
    """A filter's verdict (control flow inside this module only)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


# ------------------------------------------------------------------ record filters


def _check_calls(c: Candidate) -> None:
    for i, m in enumerate(c.messages):
        offered = {tool_name(t) for t in c.tools_at(i)}
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                with contextlib.suppress(ValueError, RecursionError):
                    args = json.loads(args)
            if not isinstance(name, str) or not name or not isinstance(args, dict):
                raise _Reject("malformed_tool_call", f"message {i}: {json.dumps(fn)[:200]}")
            if name not in offered:
                raise _Reject("unknown_tool", f"message {i}: {name!r} is not offered")


def _check_record(c: Candidate, options: DataOptions) -> None:
    if c.termination in BAD_TERMINATIONS:
        raise _Reject(f"termination:{c.termination}", str(c.meta.get("error", ""))[:200])
    problem = conversation_problem(c.messages, [tools for _, tools in c.offers])
    if problem:
        raise _Reject(*problem)
    _check_calls(c)
    if options.min_reward is not None and c.reward is not None and c.reward < options.min_reward:
        raise _Reject("low_reward", f"reward {c.reward} < {options.min_reward}")


# ------------------------------------------------------------------ conversations


def _fit(
    tokenizer: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]], options: DataOptions
) -> tuple[list[dict[str, Any]], Tokenized, bool]:
    """The conversation tokenized, cut at a turn boundary if allowed and needed."""
    limit = options.max_length
    try:
        tok: Tokenized | None = tokenize(tokenizer, msgs, tools, max_tokens=limit)
        detail = ""
    except ControlTextError as exc:
        raise _Reject("control_text", exc.message) from exc
    except TooLongError as exc:
        tok, detail = None, exc.message
    except DataError as exc:
        raise _Reject("no_trained_tokens", exc.message) from exc
    if tok is not None and tok.num_tokens <= limit:
        return msgs, tok, False
    if options.overlong == "truncate":
        after = last_query(msgs)
        ends = [i for i in range(len(msgs) - 2, after, -1) if msgs[i].get("role") == "assistant"]
        for end in ends:
            try:
                cut = tokenize(tokenizer, msgs[: end + 1], tools, max_tokens=limit)
            except DataError:  # TooLongError, or nothing to train in this prefix
                continue
            if cut.num_tokens <= limit:
                return msgs[: end + 1], cut, True
    if tok is not None:
        detail = f"{tok.num_tokens} tokens > max_length {limit}"
    raise _Reject("too_long", detail)


def _conversations(
    c: Candidate, options: DataOptions
) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """(id, index of the turn's query, messages) for each conversation of the record."""
    parts = split_turns(c.messages) if options.split_turns else [list(c.messages)]
    if not parts:
        raise _Reject("no_trained_tokens", "no user turn has an assistant reply")
    if len(parts) == 1:
        return [(c.record_id, last_query(parts[0]), parts[0])]
    return [(f"{c.record_id}#turn{k}", last_query(p), p) for k, p in enumerate(parts, start=1)]


def _digest(msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    text = json.dumps({"m": msgs, "t": tools}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Builder:
    tokenizer: Any
    options: DataOptions
    stats: DataStats
    seen: set[str]
    rows: list[_Built]
    rejections: list[Rejection]

    def reject(self, c: Candidate | Unreadable, rec_id: str, err: _Reject) -> None:
        """Record the rejection of ``c`` (the build goes on)."""
        self.rejections.append(
            Rejection(file=c.file, line=c.line, id=rec_id, reason=err.reason, detail=err.detail)
        )
        self.stats.rejections[err.reason] = self.stats.rejections.get(err.reason, 0) + 1

    def add(self, c: Candidate) -> None:
        self.stats.by_source[c.source] = self.stats.by_source.get(c.source, 0) + 1
        if c.unused:
            counts = self.stats.unused_fields.setdefault(c.source, {})
            for name in c.unused:
                counts[name] = counts.get(name, 0) + 1
        try:
            _check_record(c, self.options)
        except _Reject as err:
            self.reject(c, c.record_id, err)
            return
        try:
            convs = _conversations(c, self.options)
        except _Reject as err:
            self.reject(c, c.record_id, err)
            return
        self.stats.splits += len(convs) - 1
        for k, (rec_id, query, msgs) in enumerate(convs, start=1):
            try:
                self.rows.append(self.conversation(c, rec_id, query, msgs, (k, len(convs))))
            except _Reject as err:
                self.reject(c, rec_id, err)

    def conversation(
        self,
        c: Candidate,
        rec_id: str,
        query: int,
        msgs: list[dict[str, Any]],
        turn: tuple[int, int],
    ) -> _Built:
        tools = c.tools_at(query)
        digest = _digest(msgs, tools)
        if self.options.dedupe and digest in self.seen:
            raise _Reject("duplicate", "same messages and tools as an earlier conversation")
        self.seen.add(digest)
        msgs, tok, truncated = _fit(self.tokenizer, msgs, tools, self.options)
        try:
            check_matches_serving(self.tokenizer, msgs, tools)
        except DataError as exc:
            raise _Reject("template_mismatch", str(exc)[:2000]) from exc
        prov = {
            "file": c.file,
            "line": c.line,
            "record_id": c.record_id,
            "turn": turn[0],
            "turns": turn[1],
            "truncated": truncated,
            **c.meta,
        }
        if c.reward is not None:
            prov["reward"] = c.reward
        self.count(msgs, tok, truncated)
        row = SFTRow(id=rec_id, source=c.source, messages=msgs, tools=tools, provenance=prov)
        return _Built(row=row, tokens=tok)

    def count(self, msgs: list[dict[str, Any]], tok: Tokenized, truncated: bool) -> None:
        trained = [m for m in msgs[last_query(msgs) + 1 :] if m.get("role") == "assistant"]
        s = self.stats
        s.conversations += 1
        s.tokens += tok.num_tokens
        s.trained_tokens += tok.num_trained
        s.max_tokens = max(s.max_tokens, tok.num_tokens)
        s.turns += len(trained)
        s.tool_calls += sum(len(m.get("tool_calls") or []) for m in trained)
        s.truncations += int(truncated)


# ------------------------------------------------------------------ fingerprint and output


def fingerprint(inputs: list[Path], options: DataOptions, tokenizer: Any) -> str:
    """What a build depends on: the inputs' bytes, the options, the tokenizer and template."""
    vocab = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    keep = {
        "format": FORMAT,
        "inputs": [file_sha256(p) for p in inputs],
        "options": options.model_dump(mode="json", exclude={"tokenizer"}),
        "template": serving_template(tokenizer),
        "vocab": hashlib.sha256(vocab.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


OUTPUTS = ("sft.parquet", "stats.json", "rejections.jsonl")


def _check_paths(inputs: list[Path], out: Path) -> None:
    """ConfigError, before any work, if an input cannot be read or ``out`` cannot be written."""
    if not inputs:
        raise ConfigError("no input file given")
    for path in inputs:
        if path.is_dir():
            raise ConfigError(f"input {path} is a directory: pass the files in it")
        if not path.exists():
            raise ConfigError(f"input {path} not found")
        if not path.is_file():
            raise ConfigError(f"input {path} is not a regular file")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise ConfigError(f"input {path} cannot be read: {exc.strerror}") from None
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory")
    parent, problem = creation_problem(out)
    if isinstance(problem, NotADirectoryError):
        raise ConfigError(f"--out {out}: {parent} is a file, not a directory")
    if problem is not None:
        raise ConfigError(f"--out {out}: {parent} is not writable ({problem.strerror})")


def _check_out(out: Path, digest: str, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory")
    if overwrite or not out.is_dir():
        return
    stats = out / "stats.json"
    if stats.is_file():
        try:
            old = json.loads(stats.read_text()).get("fingerprint")
        except ValueError:
            old = None
        if old == digest:
            return
        raise ConfigError(
            f"{out} holds a different SFT data build (fingerprint {old})",
            hint="choose another --out, or pass --overwrite",
        )
    if any(out.iterdir()):
        raise ConfigError(
            f"{out} is not empty and holds no SFT data build",
            hint="choose another --out, or pass --overwrite",
        )


def _write_parquet(rows: list[_Built], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def js(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    table = pa.table(
        {
            "id": pa.array([b.row.id for b in rows], pa.string()),
            "source": pa.array([b.row.source for b in rows], pa.string()),
            "messages": pa.array([js(b.row.messages) for b in rows], pa.string()),
            "tools": pa.array([js(b.row.tools) for b in rows], pa.string()),
            "provenance": pa.array([js(b.row.provenance) for b in rows], pa.string()),
            "num_tokens": pa.array([b.tokens.num_tokens for b in rows], pa.int64()),
            "num_trained_tokens": pa.array([b.tokens.num_trained for b in rows], pa.int64()),
        }
    )
    pq.write_table(table, path)


def _write_outputs(
    out: Path, rows: list[_Built], stats: DataStats, rejections: list[Rejection]
) -> None:
    lines = "".join(r.model_dump_json() + "\n" for r in rejections)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic_with(out / "sft.parquet", lambda p: _write_parquet(rows, p))
        write_text_atomic(out / "rejections.jsonl", lines)
        # stats.json last: it marks the build complete (and carries its fingerprint)
        write_text_atomic(out / "stats.json", stats.model_dump_json(indent=2))
    except OSError as exc:  # the disk filled, or --out changed since it was checked
        raise AstraError(f"writing {out} failed: {exc}") from None


UNREADABLE = ("invalid_json", "undecodable", "line_too_long", "unknown_format", "torn_line")


def _empty_error(stats: DataStats, rejections: list[Rejection]) -> DataError:
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(stats.rejections.items())) or "no records"
    first = rejections[0] if rejections else None
    where = (
        f"; first: {first.file}:{first.line} {first.reason} {first.detail[:200]}" if first else ""
    )
    unreadable = first is not None and all(r.reason in UNREADABLE for r in rejections)
    return DataError(
        f"no conversation left to train on after filtering ({counts}){where}",
        hint=FORMATS_HINT
        if unreadable
        else "check --min-reward / --max-length, or the inputs' terminations",
    )


def build_sft_data(
    inputs: list[Path],
    out: Path,
    options: DataOptions,
    progress: Progress | None = None,
    *,
    overwrite: bool = False,
) -> DataStats:
    """Read, filter, split and tokenize ``inputs``; write ``out/sft.parquet``, ``stats.json``
    and ``rejections.jsonl`` (nothing is written if the build fails)."""
    _check_paths(inputs, out)
    tokenizer = load_tokenizer(options.tokenizer)
    digest = fingerprint(inputs, options, tokenizer)
    _check_out(out, digest, overwrite)
    records = read_inputs(inputs)
    stats = DataStats(
        fingerprint=digest,
        inputs=[str(p) for p in inputs],
        options=options.model_dump(mode="json"),
        records=len(records),
    )
    b = _Builder(tokenizer, options, stats, set(), [], [])
    for i, rec in enumerate(records, start=1):
        if isinstance(rec, Unreadable):
            b.reject(rec, f"{Path(rec.file).name}:{rec.line}", _Reject(rec.reason, rec.detail))
        else:
            b.add(rec)
        if progress is not None:
            progress(i, len(records))
    if not b.rows:
        raise _empty_error(stats, b.rejections)
    stats.rejections = dict(sorted(stats.rejections.items()))
    _write_outputs(out, b.rows, stats, b.rejections)
    return stats


def read_sft_parquet(paths: list[Path]) -> list[SFTRow]:
    """The rows of ``sft.parquet`` files (JSON columns decoded)."""
    import pyarrow.parquet as pq

    rows: list[SFTRow] = []
    for path in paths:
        if not path.is_file():
            raise ConfigError(
                f"SFT data {path} not found", hint="build it with `astra-train data sft`"
            )
        try:
            table = pq.read_table(path, columns=["id", "source", "messages", "tools", "provenance"])
        except Exception as exc:  # pyarrow: ArrowInvalid, KeyError, OSError…
            raise ConfigError(f"{path} is not an `astra-train data sft` parquet: {exc}") from exc
        for rec in table.to_pylist():
            rows.append(
                SFTRow(
                    id=rec["id"],
                    source=rec["source"],
                    messages=json.loads(rec["messages"]),
                    tools=json.loads(rec["tools"]),
                    provenance=json.loads(rec["provenance"] or "{}"),
                )
            )
    return rows


def counter_table(stats: DataStats) -> list[tuple[str, str]]:
    """The summary as (label, value) pairs, for the CLI's table."""
    rows = [("records read", str(stats.records))]
    rows += [(f"  {k}", str(v)) for k, v in sorted(Counter(stats.by_source).items())]
    rows += [
        ("conversations", str(stats.conversations)),
        ("  from splits", str(stats.splits)),
        ("tokens", str(stats.tokens)),
        ("trained tokens", str(stats.trained_tokens)),
        ("longest", str(stats.max_tokens)),
        ("assistant turns", str(stats.turns)),
        ("tool calls", str(stats.tool_calls)),
        ("truncations", str(stats.truncations)),
    ]
    rows += [(f"rejected: {k}", str(v)) for k, v in stats.rejections.items()]
    for source, fields in stats.unused_fields.items():
        rows.append((f"unused fields ({source})", ", ".join(sorted(fields))))
    return rows
