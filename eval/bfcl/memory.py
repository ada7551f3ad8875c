"""BFCL V4 memory (``memory_kv``, ``memory_rec_sum``): a memory backend filled by prerequisite
conversations, then questions answered from it, scored on the final answer.

The official flow, reproduced here with the official backend classes and prompt texts:

- Per scenario (student, customer, finance, healthcare, notetaker) and backend, a chain of
  prerequisite conversations (``memory_prereq_conversation/``, ids ``<category>_prereq_N-…``)
  runs first, one after the other, each as a multi-turn FC entry with the backend's functions
  as tools. The first starts from an empty memory; each loads the snapshot the previous one
  left (``<scenario>_final.json``) and writes its own at its end (the backend's
  ``_flush_memory_to_local_file``), force-terminated or not.
- Each question (one turn) then loads the scenario's final snapshot into a fresh backend
  instance and is answered in up to 20 steps; what it does to the memory is not kept.
- System prompts: the memory instruction (with the scenario's setting and the memory content
  the conversation starts from) first; a question also carries the agentic answer-format
  prompt after it (``add_memory_instruction_system_prompt``,
  ``ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT``: imported, not copied).
- Scoring (:func:`memory_verdict`): the result must be one turn; the last step that does not
  decode into calls (the FC decoder) is the answer; it passes when one gold answer, standardised,
  is found in it between word boundaries (case, ``,./-_*^()`` and quote style ignored).

Steps are stored as the official OpenAI-compatible FC handler stores them: the calls
``[{name: arguments}]`` when the reply carried a ``tool_calls`` list (an empty one too: vLLM
sends ``[]`` beside a text reply, and the official checker then finds no final message), else
the text. Where our flow departs from the official one it says so: a prerequisite conversation
whose endpoint failed makes the scenario's questions inference errors (the official pipeline
goes on with the memory of the conversations before it and scores the answers).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from astra_agent.episode import EpisodeLimits, run_episode
from astra_agent.errors import ConfigError
from astra_agent.model import ChatModel, ModelTurn
from astra_agent.runio import read_json_lines, write_json_atomic
from astra_agent.trajectory import FailureKind, Trajectory
from eval.bfcl.backend import OFFICIAL_CALLS, STEP_LIMIT, BFCLEnvironment, decode_step
from eval.bfcl.categories import REFUSED
from eval.bfcl.official import Entry, package_dir
from eval.results import ErrorKind

MEMORY_CATEGORIES = ("memory_kv", "memory_rec_sum")
BACKENDS = {"memory_kv": "MemoryAPI_kv", "memory_rec_sum": "MemoryAPI_rec_sum"}
INFERENCE_ERROR = "agentic:inference_error"
NO_LAST_MESSAGE = "agentic:no_last_message"
ANSWER_NOT_FOUND = "agentic:answer_not_found"
CRASH = "agentic:crash"  # where the official checker raises (its `bfcl evaluate` stops there)
_PUNCTUATION = re.compile(r"[,./\-_*^()]")


@dataclass(frozen=True)
class Conversation:
    """One prerequisite conversation: user messages per turn, fed to the memory backend."""

    id: str  # official id: <category>_prereq_N-<scenario>-K
    category: str
    scenario: str
    question: list[list[dict[str, Any]]]


@dataclass(frozen=True)
class MemoryEntry:
    """One scored question: its user message (one turn), the gold answers (any one passes),
    and the prerequisite conversations whose memory it is asked about."""

    id: str  # official id: <category>_N-<scenario>-K
    category: str
    scenario: str
    question: list[list[dict[str, Any]]]
    ground_truth: tuple[str, ...]
    prerequisites: tuple[str, ...]


def _check(category: str) -> None:
    if category in MEMORY_CATEGORIES:
        return
    if category in REFUSED:
        raise ConfigError(f"BFCL category {category!r} cannot run here: {REFUSED[category]}")
    raise ConfigError(
        f"not a BFCL memory category: {category!r} (choose from {', '.join(MEMORY_CATEGORIES)})"
    )


@cache
def scenarios() -> tuple[str, ...]:
    """The official scenario order (prerequisite chains are built in it)."""
    from bfcl_eval.constants.category_mapping import MEMORY_SCENARIO_NAME

    return tuple(MEMORY_SCENARIO_NAME)


@cache
def prerequisites(category: str, scenario: str) -> tuple[Conversation, ...]:
    """A scenario's prerequisite conversations, in the order they run."""
    _check(category)
    path = package_dir() / "data" / "memory_prereq_conversation" / f"memory_{scenario}.json"
    return tuple(
        Conversation(r["id"].replace("memory", category), category, scenario, r["question"])
        for r in read_json_lines(path)
    )


@cache
def load_memory(category: str) -> tuple[MemoryEntry, ...]:
    """The scored questions of ``memory_kv`` or ``memory_rec_sum``, in the official order;
    ``memory_vector`` (and anything else) is refused with the reason."""
    _check(category)
    data = package_dir() / "data"
    rows = read_json_lines(data / "BFCL_v4_memory.json")
    gold = read_json_lines(data / "possible_answer" / "BFCL_v4_memory.json")
    out = []
    for row, answer in zip(rows, gold, strict=True):  # aligned by position, as officially
        if row["id"] != answer["id"]:
            raise ConfigError(f"BFCL memory data out of order at {row['id']}")
        scenario = row["scenario"]
        pre = tuple(c.id for c in prerequisites(category, scenario))
        out.append(
            MemoryEntry(
                row["id"].replace("memory", category),
                category,
                scenario,
                row["question"],
                tuple(answer["ground_truth"]),
                pre,
            )
        )
    return tuple(out)


# ------------------------------------------------------------------ scoring


def standardize(text: str) -> str:
    """The official comparison form: without ``,./-_*^()``, lower case, ``'`` as ``"``."""
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


def final_message(turn: Any) -> Any:
    """The last step of ``turn`` that does not decode into calls (the official answer), or
    None. Iterates ``turn`` as the official evaluator does (a string by characters, an object
    by keys); raises TypeError where it does (a turn that is no sequence)."""
    last = None
    for step in turn:
        if not decode_step(step):
            last = step
    return last


def memory_verdict(entry: MemoryEntry, responses: Any) -> tuple[bool, str | None, dict[str, Any]]:
    """``(valid, error_type, details)`` of a stored result (``responses``: per turn, per step,
    the official result format) with the official agentic checker's semantics."""
    if type(responses) is not list or len(responses) != 1:
        return False, INFERENCE_ERROR, {"reason": "the result is not one turn of model steps"}
    try:
        last = final_message(responses[0])
    except TypeError as exc:
        return False, CRASH, {"reason": f"the official checker raises here (TypeError: {exc})"}
    if not last:
        return False, NO_LAST_MESSAGE, {"reason": "no final message that is not a call"}
    answer = last[0] if type(last) is list else last
    text = answer if type(answer) is str else str(answer)
    said = standardize(text)
    for gold in entry.ground_truth:
        if re.search(rf"\b{re.escape(standardize(gold))}\b", said):
            return True, None, {}
    return False, ANSWER_NOT_FOUND, {"answer": text, "possible_answers": list(entry.ground_truth)}


# ------------------------------------------------------------------ inference


@dataclass
class MemoryOutcome:
    """One question's result: the verdict, the raw steps (official result format), the
    trajectory; an inference or run error with its cause (never a wrong answer)."""

    valid: bool
    error_type: str | None
    details: dict[str, Any]
    responses: list[list[Any]]
    trajectory: Trajectory | None
    error: str | None = None
    error_kind: ErrorKind | None = None
    endpoint_failure: FailureKind | None = None


class ConversationRecord(BaseModel):
    """One prerequisite conversation as it ran (kept beside the snapshot, for diagnosis)."""

    id: str
    responses: list[list[Any]]
    termination: str
    trajectory: Trajectory


class ScenarioRecord(BaseModel):
    """A scenario's completed prerequisite chain: written once every conversation ran, so
    that a resumed run reuses the snapshot (``memory``: the final snapshot's content)."""

    category: str
    scenario: str
    conversations: list[ConversationRecord]
    memory: dict[str, Any]


@dataclass(frozen=True)
class _Prepared:
    """Whether a scenario's memory is ready for its questions, and why not."""

    error: str | None = None
    error_kind: ErrorKind | None = None
    endpoint_failure: FailureKind | None = None


@dataclass
class _Talk:
    traj: Trajectory | None = None
    responses: list[list[Any]] = field(default_factory=list)
    empty_list_text: str = ""  # the last text stored as [] (sent beside an empty tool_calls)


def official_step(turn: ModelTurn) -> Any:
    """A model step as the official FC handler stores it (see the module's doc)."""
    if turn.tool_calls or turn.raw.get("tool_calls_list"):
        return [{c.name: c.arguments} for c in turn.tool_calls]
    return turn.content


def _snapshot_dir(workdir: Path, category: str) -> Path:
    """Where the official backend keeps a category's snapshots under a result directory."""
    from bfcl_eval.utils import get_directory_structure_by_category

    return workdir / get_directory_structure_by_category(category) / "memory_snapshot"


class MemoryRunner:
    """Runs memory questions for one eval run. Each scenario's prerequisite chain runs once
    (the first question of the scenario starts it, the others wait on it; ``expected`` lets
    the first question start every chain its entries need, so that chains run side by side)
    and its snapshot stays under ``workdir`` (the backend's own layout), reused on resume."""

    def __init__(
        self, workdir: Path, tool_timeout_s: float = 60.0, expected: Iterable[MemoryEntry] = ()
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.tool_timeout_s = tool_timeout_s
        self._expected = {(e.category, e.scenario) for e in expected}
        self._lock = asyncio.Lock()
        self._chains: dict[tuple[str, str], asyncio.Task[_Prepared]] = {}

    async def run(self, entry: MemoryEntry, model: ChatModel) -> MemoryOutcome:
        """Infer one question (its scenario's prerequisite chain first, once) and score it."""
        talk = _Talk()
        try:
            prepared = await self._prepared(entry, model)
            if prepared.error is not None:
                return MemoryOutcome(
                    valid=False,
                    error_type=INFERENCE_ERROR if prepared.error_kind == "inference" else None,
                    details={"scenario": entry.scenario},
                    responses=[],
                    trajectory=None,
                    error=prepared.error,
                    error_kind=prepared.error_kind,
                    endpoint_failure=prepared.endpoint_failure,
                )
            env = await asyncio.to_thread(self._environment, entry)
            await self._converse(env, self._question(entry, env), model, talk)
        except Exception as exc:  # one entry's failure is recorded with its cause
            err = f"{type(exc).__name__}: {exc}"
            return MemoryOutcome(False, None, {}, talk.responses, talk.traj, err, "run")
        traj = talk.traj
        if traj is not None and traj.termination == "model_error":
            return MemoryOutcome(
                valid=False,
                error_type=INFERENCE_ERROR,
                details={},
                responses=talk.responses,
                trajectory=traj,
                error=f"inference error: {traj.termination_detail}",
                error_kind="inference",
                endpoint_failure=traj.model_failure,
            )
        valid, error_type, details = memory_verdict(entry, talk.responses)
        if not valid and talk.empty_list_text:
            details["text_beside_empty_tool_calls"] = talk.empty_list_text
        return MemoryOutcome(valid, error_type, details, talk.responses, traj)

    # -- the prerequisite chains

    async def _prepared(self, entry: MemoryEntry, model: ChatModel) -> _Prepared:
        key = (entry.category, entry.scenario)
        async with self._lock:
            for k in sorted({key} | self._expected, key=lambda k: k != key):
                if k not in self._chains:
                    self._chains[k] = asyncio.create_task(self._chain(*k, model))
            task = self._chains[key]
        return await asyncio.shield(task)  # a cancelled question leaves the chain running

    async def _chain(self, category: str, scenario: str, model: ChatModel) -> _Prepared:
        try:
            return await self._build(category, scenario, model)
        except Exception as exc:  # recorded by every question of the scenario
            return _Prepared(
                f"the prerequisite conversations of {scenario} failed to run: "
                f"{type(exc).__name__}: {exc}",
                "run",
            )

    def _record_path(self, category: str, scenario: str) -> Path:
        return self.workdir / "prerequisites" / category / f"{scenario}.json"

    def _reusable(self, category: str, scenario: str) -> bool:
        """A completed chain whose final snapshot is still the one it left."""
        path = self._record_path(category, scenario)
        final = _snapshot_dir(self.workdir, category) / f"{scenario}_final.json"
        try:
            record = ScenarioRecord.model_validate_json(path.read_text())
            return bool(json.loads(final.read_text()) == record.memory)
        except (OSError, ValueError):
            return False

    async def _build(self, category: str, scenario: str, model: ChatModel) -> _Prepared:
        if await asyncio.to_thread(self._reusable, category, scenario):
            return _Prepared()
        path = self._record_path(category, scenario)
        path.unlink(missing_ok=True)
        done: list[ConversationRecord] = []
        cls = BACKENDS[category]
        for conv in prerequisites(category, scenario):
            env = await asyncio.to_thread(self._environment, conv)
            instance = env.instances[cls]
            turns = _with_memory_prompt(conv.question, f"{category}_prereq", scenario, instance)
            talk = _Talk()
            await self._converse(env, turns, model, talk)
            assert talk.traj is not None
            done.append(
                ConversationRecord(
                    id=conv.id,
                    responses=talk.responses,
                    termination=talk.traj.termination,
                    trajectory=talk.traj,
                )
            )
            if talk.traj.termination == "model_error":
                return _Prepared(
                    f"inference error in the prerequisite conversation {conv.id} (the memory "
                    f"its questions ask about is incomplete): {talk.traj.termination_detail}",
                    "inference",
                    talk.traj.model_failure,
                )
            await asyncio.to_thread(instance._flush_memory_to_local_file)
        final = _snapshot_dir(self.workdir, category) / f"{scenario}_final.json"
        memory = json.loads(final.read_text())
        record = ScenarioRecord(
            category=category, scenario=scenario, conversations=done, memory=memory
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record.model_dump(mode="json"))
        return _Prepared()

    # -- one conversation

    def _environment(self, item: MemoryEntry | Conversation) -> BFCLEnvironment:
        """The backend for one conversation, loaded as the official harness loads it (the
        snapshot it starts from is chosen by the backend from the conversation's id)."""
        cls = BACKENDS[item.category]
        prereq = isinstance(item, Conversation)
        config = {
            "model_result_dir": self.workdir,
            "scenario": item.scenario,
            "test_id": item.id,
            "test_category": f"{item.category}_prereq" if prereq else item.category,
        }
        entry = Entry(item.id, item.category, item.question, {cls: config}, [cls], {}, [])
        return BFCLEnvironment(entry, tag="astra_memory")

    @staticmethod
    def _question(entry: MemoryEntry, env: BFCLEnvironment) -> list[list[dict[str, Any]]]:
        from bfcl_eval.constants.default_prompts import (
            ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT as ANSWER_FORMAT,
        )

        turns = copy.deepcopy(entry.question)
        turns[0].insert(0, {"role": "system", "content": ANSWER_FORMAT})
        instance = env.instances[BACKENDS[entry.category]]
        return _with_memory_prompt(turns, entry.category, entry.scenario, instance)

    async def _converse(
        self, env: BFCLEnvironment, turns: list[list[dict[str, Any]]], model: ChatModel, talk: _Talk
    ) -> None:
        """Every turn through the loop with the official step limit and call semantics, into
        ``talk``; a force-terminated turn (step limit) or a failed model call ends it."""

        limits = EpisodeLimits(
            max_steps=STEP_LIMIT + 1, tool_timeout_s=self.tool_timeout_s, max_tool_output_chars=None
        )
        tools = await env.list_tools()
        for msgs in turns:
            steps: list[Any] = []
            talk.responses.append(steps)

            def keep(turn: ModelTurn, steps: list[Any] = steps) -> None:
                step = official_step(turn)
                steps.append(step)
                if step == [] and turn.content:
                    talk.empty_list_text = turn.content

            talk.traj = await run_episode(
                model,
                env,
                msgs,
                limits=limits,
                trajectory=talk.traj,
                tools=tools,
                policy=OFFICIAL_CALLS,
                on_turn=keep,
            )
            if talk.traj.termination in ("model_error", "max_steps"):
                break


def _with_memory_prompt(
    turns: list[list[dict[str, Any]]], test_category: str, scenario: str, instance: Any
) -> list[list[dict[str, Any]]]:
    """The official memory instruction (with the memory content ``instance`` starts from) as
    the first turn's system prompt, before a system prompt already there."""
    from bfcl_eval.model_handler.utils import add_memory_instruction_system_prompt

    return add_memory_instruction_system_prompt(
        copy.deepcopy(turns), test_category, scenario, instance
    )
