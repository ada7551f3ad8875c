"""τ² through inspect_ai: the one module of the harness that touches inspect_ai. inspect_evals'
τ² loop is run unchanged (why: docs/evaluation.md); what is ours is

* **the endpoint path**: our :class:`~astra_agent.model.ChatModel` as an inspect_ai model
  provider (:class:`ChatModelAPI`): τ²'s agent and its user simulator reach their endpoints
  through it, so the Qwen3 contract, the retries and the error kinds are the harness's own
  (inspect_ai's OpenAI provider drops vLLM's ``reasoning_content``, and its token counting
  downloads tiktoken's encodings at run time). Sampling is the
  :class:`~astra_agent.model.ModelConfig`'s (what ``astra-eval tau2`` was given, recorded in the
  run's fingerprint), not the ``temperature=0`` τ²'s code asks inspect_ai for;
* **the conversation's own state** (:class:`Conversation`, typed accessors over the sample's
  store, the only code that reads or writes its keys): usage as the server counted it (inspect_ai
  never counts tokens itself: offline-safe), and an endpoint failure, which is not a move of the
  conversation: τ²'s loop catches every exception and goes on (up to its message limit), and a
  conversation cut short would be scored as the agent's failure. The first failure is kept and
  every call after it ends the conversation (``###STOP###``); it is recorded as an error,
  unscored;
* **the player** (:class:`Tau2Player`, the eval runner's :data:`eval.runner.Player`): one
  inspect_ai eval (inspect_ai runs one at a time in a process) plays the conversations still to
  run, ``concurrency`` at once, each ending in a scorer that builds its
  :class:`~eval.tau2.records.Tau2Record` from the sample's state and hands it to the runner's
  worker waiting for it;
* inspect_ai's **private hooks** we use, all in :func:`_untracked_store` and
  :func:`_quiet_start`.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inspect_ai import Task, eval_async
from inspect_ai.dataset import MemoryDataset
from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    Model,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    get_model,
    modelapi,
)
from inspect_ai.scorer import CORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.tool import ToolCall, ToolChoice, ToolInfo
from inspect_ai.util import Store, store, store_as

from astra_agent.errors import ServerError
from astra_agent.model import ChatModel, EndpointError, ModelTurn
from astra_agent.trajectory import FailureKind, Trajectory, Usage
from eval.runner import Clients, PlayOne
from eval.tau2.records import Domain, Item, Tau2Record, error_record

STOP = "###STOP###"
USER = "user_simulator"  # the user simulator's endpoint (eval.runner.EvalSpec.endpoints)


# ------------------------------------------------------------------ the conversation's state


@dataclass(frozen=True)
class Failure:
    """A conversation's first endpoint failure: the side whose endpoint failed (``agent`` or
    ``user``), what it said, its kind (:class:`~astra_agent.model.EndpointError`'s)."""

    side: str
    error: str
    kind: FailureKind


class Conversation:
    """One conversation's state in its sample's store (inspect_ai's per-sample store), where
    both the model provider and the scorer see it; the only reader and writer of these keys."""

    SAMPLE = "astra_tau2_sample"  # the conversation's id, sent as each request's ``user``
    FAILURE = "astra_tau2_failure"  # the first endpoint failure: Failure as a dict
    RUN_ERROR = "astra_tau2_run_error"  # an exception of the conversation outside τ²'s loop
    USAGE = "astra_tau2_usage"  # {side: {prompt_tokens, completion_tokens, calls}}
    AGENT_TOOLS = "astra_tau2_agent_tools"  # the tools the agent was offered, as it was sent
    OVER = "astra_tau2_max_steps"  # set once the model calls reached max_steps

    def __init__(self, sample_store: Store) -> None:
        self._store = sample_store

    @classmethod
    def current(cls) -> Conversation:
        """The conversation of the sample being played (inside one of its model calls)."""
        return cls(store())

    def start(self, sample_id: str) -> None:
        self._store.set(self.SAMPLE, f"tau2:{sample_id}")

    @property
    def tag(self) -> str | None:
        """The conversation's id as the endpoints are sent it (``tau2:domain/task_id/trial``)."""
        tag = self._store.get(self.SAMPLE)
        return None if tag is None else str(tag)

    @property
    def failure(self) -> Failure | None:
        raw = self._store.get(self.FAILURE)
        return None if raw is None else Failure(**raw)

    def fail(self, failure: Failure) -> None:
        self._store.set(self.FAILURE, asdict(failure))

    @property
    def run_error(self) -> str | None:
        return self._store.get(self.RUN_ERROR)

    def set_run_error(self, error: str) -> None:
        self._store.set(self.RUN_ERROR, error)

    @property
    def failed(self) -> bool:
        """An endpoint failed, or the conversation raised: it is recorded unscored."""
        return self.failure is not None or self.run_error is not None

    @property
    def usage(self) -> dict[str, dict[str, int]]:
        return self._store.get(self.USAGE) or {}

    @property
    def calls(self) -> int:
        """Model calls so far, both sides'."""
        return sum(side["calls"] for side in self.usage.values())

    def count(self, side: str, turn: ModelTurn) -> None:
        usage = self.usage
        mine = usage.setdefault(side, {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0})
        mine["prompt_tokens"] += turn.prompt_tokens
        mine["completion_tokens"] += turn.completion_tokens
        mine["calls"] += 1
        self._store.set(self.USAGE, usage)

    @property
    def agent_tools(self) -> list[dict[str, Any]]:
        return self._store.get(self.AGENT_TOOLS) or []

    def offer_agent_tools(self, schemas: list[dict[str, Any]]) -> None:
        """The agent's tools as first sent (kept once: the record's trajectory's)."""
        if self._store.get(self.AGENT_TOOLS) is None:
            self._store.set(self.AGENT_TOOLS, schemas)

    @property
    def over(self) -> bool:
        return bool(self._store.get(self.OVER))

    def end_at_max_steps(self) -> None:
        self._store.set(self.OVER, True)


# ------------------------------------------------------------------ the endpoint path


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(c.text for c in content if isinstance(c, ContentText))


def _reasoning(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return ""
    return "".join(c.reasoning for c in content if isinstance(c, ContentReasoning))


def to_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """inspect_ai's messages as the chat API takes them (reasoning as ``reasoning_content``,
    which :func:`astra_agent.reply.prepare_messages` keeps or drops as Qwen3's template does)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, ChatMessageSystem | ChatMessageUser):
            out.append({"role": m.role, "content": _text(m.content)})
        elif isinstance(m, ChatMessageAssistant):
            msg: dict[str, Any] = {"role": "assistant", "content": _text(m.content)}
            if reasoning := _reasoning(m.content):
                msg["reasoning_content"] = reasoning
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function, "arguments": _arguments(c)},
                    }
                    for c in m.tool_calls
                ]
            out.append(msg)
        elif isinstance(m, ChatMessageTool):
            text = _text(m.content)
            if m.error is not None:
                text = text or f"Error: {m.error.message}"
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": text})
        else:  # pragma: no cover - inspect_ai has no other message kind
            raise TypeError(f"unknown message {type(m).__name__}")
    return out


def _arguments(call: ToolCall) -> str:
    """A call's arguments as the model wrote them: the raw text when they did not parse."""
    if call.parse_error is not None and isinstance(call.arguments.get("__raw__"), str):
        return str(call.arguments["__raw__"])
    return json.dumps(call.arguments, ensure_ascii=False)


def to_tools(tools: list[ToolInfo]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters.model_dump(exclude_none=True),
            },
        }
        for t in tools
    ]


def to_output(turn: ModelTurn, model: str) -> ModelOutput:
    """A reply as inspect_ai's output: reasoning as a reasoning part, calls with their
    arguments parsed (one that does not parse keeps its text and says why, so the model is
    told), usage as the server counted it."""
    content: list[Any] = []
    if turn.reasoning:
        content.append(ContentReasoning(reasoning=turn.reasoning))
    if turn.content or not content:
        content.append(ContentText(text=turn.content))
    calls = []
    for c in turn.tool_calls:
        try:
            args = json.loads(c.arguments or "{}")
            error = None if isinstance(args, dict) else "the arguments are not a JSON object"
        except json.JSONDecodeError as exc:
            args, error = None, f"the arguments are not JSON: {exc}"
        if error is not None:
            args = {"__raw__": c.arguments}
        calls.append(ToolCall(id=c.id, function=c.name, arguments=args, parse_error=error))
    message = ChatMessageAssistant(content=content, tool_calls=calls or None, model=model)
    stop = "tool_calls" if calls else ("max_tokens" if turn.finish_reason == "length" else "stop")
    usage = ModelUsage(
        input_tokens=turn.prompt_tokens,
        output_tokens=turn.completion_tokens,
        total_tokens=turn.prompt_tokens + turn.completion_tokens,
    )
    choice = ChatCompletionChoice(message=message, stop_reason=stop)
    return ModelOutput(model=model, choices=[choice], usage=usage)


def _stop(model: str) -> ModelOutput:
    return ModelOutput.from_content(model=model, content=STOP)


class ChatModelAPI(ModelAPI):
    """One endpoint (τ²'s agent, or its user simulator: ``side``) through a :class:`ChatModel`
    whose model is already checked (its name known). Made by :func:`inspect_model`."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),
        *,
        chat: ChatModel,
        side: str,
        max_connections: int,
        max_steps: int,
    ) -> None:
        super().__init__(model_name=model_name, base_url=base_url, config=config)
        self.chat = chat
        self.side = side
        self._max_connections = max_connections
        self.max_steps = max_steps

    def max_connections(self) -> int:
        return self._max_connections

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        conv = Conversation.current()
        if conv.failure is not None or conv.over:
            return _stop(self.chat.name)
        if conv.calls >= self.max_steps:
            # τ²'s agent loops for as long as the model calls tools: a model that never stops
            # ends here, scored as it stands (τ²'s own max_steps)
            conv.end_at_max_steps()
            return _stop(self.chat.name)
        schemas = to_tools(tools)
        if self.side == "agent":
            conv.offer_agent_tools(schemas)
        try:
            turn = await self.chat.complete(to_messages(input), schemas or None, user=conv.tag)
        except ServerError as exc:
            kind = exc.kind if isinstance(exc, EndpointError) else "other"
            conv.fail(Failure(self.side, str(exc), kind))
            return _stop(self.chat.name)
        conv.count(self.side, turn)
        return to_output(turn, self.chat.name)


@modelapi(name="astra")
def _astra() -> type[ModelAPI]:
    return ChatModelAPI


def inspect_model(chat: ChatModel, side: str, max_connections: int, max_steps: int) -> Model:
    """``chat`` (checked: its model's name known) as an inspect_ai model."""
    return get_model(
        f"astra/{chat.name}", base_url=chat.config.base_url, memoize=False, chat=chat,
        side=side, max_connections=max_connections, max_steps=max_steps,
    )  # fmt: skip


# ------------------------------------------------------------------ one conversation's record


def _termination(state: TaskState, conv: Conversation) -> str:
    if conv.failed:
        return "error"
    if conv.over:
        return "max_steps"
    text = state.output.completion if state.output else ""
    for mark, name in (("###STOP###", "stop"), ("###TRANSFER###", "transfer")):
        if mark in text:
            return name
    return "out_of_scope" if "###OUT-OF-SCOPE###" in text else "message_limit"


def _calls(messages: list[Any]) -> int:
    return sum(len(m.tool_calls or []) for m in messages if isinstance(m, ChatMessageAssistant))


def _trajectory(agent_messages: list[Any], tools: list[dict[str, Any]], model: str) -> Trajectory:
    messages = to_messages(agent_messages)
    return Trajectory(
        model=model,
        messages=messages,
        tools=tools,
        steps=sum(1 for m in messages if m["role"] == "assistant"),
    )


def _record(item: Item, state: TaskState, score: Any, model: str) -> Tau2Record:
    from inspect_evals.tau2.common.agents import StoredAgentState
    from inspect_evals.tau2.common.metadata import Tau2MetaData

    meta = Tau2MetaData.model_validate(state.metadata)
    agent = store_as(StoredAgentState, meta.instance)
    conv = Conversation(state.store)
    failure, error, usage = conv.failure, conv.run_error, conv.usage
    traj = _trajectory(agent.messages, conv.agent_tools, model)
    traj.usage = Usage(
        prompt_tokens=usage.get("agent", {}).get("prompt_tokens", 0),
        completion_tokens=usage.get("agent", {}).get("completion_tokens", 0),
    )
    fields: dict[str, Any] = {
        "id": item.id,
        "domain": item.domain,
        "task_id": item.task_id,
        "trial": item.trial,
        "turns": sum(1 for m in state.messages if isinstance(m, ChatMessageAssistant)),
        "tool_calls": _calls(agent.messages),
        "user_tool_calls": _calls(state.messages),
        "termination": _termination(state, conv),
        "usage": usage,
        "trajectory": traj,
        # the simulator's own messages (its prompt, replies, tool calls and results); the
        # agent's, which it sees as user turns, are the trajectory's
        "user_side": to_messages([m for m in state.messages if not isinstance(m, ChatMessageUser)]),
    }
    if failure is not None:
        traj.termination, traj.model_failure = "model_error", failure.kind
        traj.termination_detail = f"{failure.side}: {failure.error}"
        return Tau2Record(
            **fields, error=traj.termination_detail, error_kind="inference",
            endpoint_failure=failure.kind,
        )  # fmt: skip
    if error is not None:
        traj.termination, traj.termination_detail = "error", error
        return Tau2Record(**fields, error=error, error_kind="run")
    if fields["termination"] in ("message_limit", "max_steps"):
        traj.termination = "max_steps"
    passed = score.value == CORRECT
    return Tau2Record(**fields, reward=1.0 if passed else 0.0, explanation=score.explanation or "")


# ------------------------------------------------------------------ the bridge and the player


class _Bridge:
    """The conversations still to run, played by one inspect_ai eval; each one's record is
    handed to the worker of :func:`eval.runner.run_items` that waits for it."""

    def __init__(self, items: Sequence[Item], model: str) -> None:
        loop = asyncio.get_running_loop()
        self.model = model
        self.futures: dict[str, asyncio.Future[Tau2Record]] = {
            i.id: loop.create_future() for i in items
        }
        self.items = {i.id: i for i in items}

    async def wait(self, item: Item) -> Tau2Record:
        return await self.futures[item.id]

    def deliver(self, rec: Tau2Record) -> None:
        future = self.futures.get(rec.id)
        if future is not None and not future.done():
            future.set_result(rec)

    def end(self, exc: BaseException | None) -> None:
        """The eval is over: a conversation it ended without a record is a run error (or
        the eval's own exception)."""
        for rid, future in self.futures.items():
            if future.done():
                continue
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            elif exc is not None:
                future.set_exception(exc)
            else:
                error = "inspect_ai ended the conversation without a score"
                future.set_result(error_record(self.items[rid], error))

    async def recorded(self, state: TaskState, target: Target, inner: Any) -> Score:
        """Score a played conversation with τ²'s scorer (``inner``) unless it failed, and
        hand its record over."""
        item = self.items[str(state.sample_id)]
        conv = Conversation(state.store)
        result = None
        if not conv.failed and inner is not None:
            try:
                result = await inner(state, target)
            except Exception as exc:
                conv.set_run_error(f"scoring: {type(exc).__name__}: {exc}")
        try:
            rec = _record(item, state, result, self.model)
        except Exception as exc:
            rec = error_record(item, f"recording: {type(exc).__name__}: {exc}")
        self.deliver(rec)
        return result or Score(value=0, explanation=rec.error or "")

    def task(self, domain: str, source: Task, items: list[Item], track: bool) -> Task:
        """``source`` (τ²'s task) for ``items``: a sample per conversation (its id is the
        record's), τ²'s solver inside a guard, τ²'s scorer followed by :meth:`deliver`."""
        by_id = {str(s.id): s for s in source.dataset}
        samples = [by_id[i.task_id].model_copy(update={"id": i.id}) for i in items]
        inner_solver = source.solver
        inner_scorer = source.scorer[0] if source.scorer else None
        bridge = self

        @solver
        def guarded() -> Any:
            async def solve(state: TaskState, generate: Generate) -> TaskState:
                conv = Conversation(state.store)
                conv.start(str(state.sample_id))
                try:
                    with _untracked_store(track):
                        return await inner_solver(state, generate)
                except Exception as exc:  # recorded as the conversation's error, not scored
                    conv.set_run_error(f"{type(exc).__name__}: {exc}")
                    return state

            return solve

        @scorer(metrics=[accuracy()])
        def recorded() -> Any:
            async def score(state: TaskState, target: Target) -> Score:
                return await bridge.recorded(state, target, inner_scorer)

            return score

        return Task(
            dataset=MemoryDataset(samples, name=f"tau2_{domain}"),
            solver=guarded(),
            scorer=recorded(),
            name=f"tau2_{domain}",
        )


@dataclass(frozen=True)
class Tau2Player:
    """inspect_evals' τ² loop as the eval runner's player (:data:`eval.runner.Player`): the
    conversations still to run, a domain's task at a time, ``concurrency`` conversations at
    once, the agent on the clients' model and the user simulator on their :data:`USER`."""

    sources: Mapping[Domain, Task]  # τ²'s task of each domain
    log_dir: Path  # inspect_ai's log (kept only with keep_log)
    keep_log: bool
    concurrency: int
    max_steps: int

    @asynccontextmanager
    async def __call__(
        self, todo: Sequence[Item], clients: Clients
    ) -> AsyncIterator[PlayOne[Item, Tau2Record]]:
        bridge = _Bridge(todo, clients.model.name)
        by_domain: dict[Domain, list[Item]] = defaultdict(list)
        for i in todo:
            by_domain[i.domain].append(i)
        tasks = [
            bridge.task(d, self.sources[d], its, self.keep_log) for d, its in by_domain.items()
        ]
        play = self._play(bridge, tasks, clients) if tasks else None
        player = asyncio.create_task(play) if play is not None else None
        try:
            yield bridge.wait
        except BaseException:
            if player is not None:
                player.cancel()
                await asyncio.gather(player, return_exceptions=True)
            raise
        if player is not None:
            await player

    async def _play(self, bridge: _Bridge, tasks: list[Task], clients: Clients) -> None:
        _quiet_start()
        n, steps = self.concurrency, self.max_steps
        try:
            await eval_async(
                tasks, model=inspect_model(clients.model, "agent", n, steps),
                model_roles={"user": inspect_model(clients.others[USER], "user", n, steps)},
                log_dir=str(self.log_dir), log_samples=self.keep_log, log_realtime=False,
                fail_on_error=False, max_samples=n, max_tasks=1, max_connections=n,
                score_display=False,
            )  # fmt: skip
        except BaseException as exc:
            bridge.end(exc)
            raise
        bridge.end(None)


# ------------------------------------------------------------------ inspect_ai's private hooks


def _untracked_store(track: bool) -> AbstractContextManager[Any]:
    """inspect_ai diffs the whole store (retail: a 2.6 MB database) at every step for its
    transcript, which we do not keep (unless ``track``): 2/3 of the CPU of a conversation. The
    store itself works as usual."""
    from inspect_ai.util._store import suspend_store_events

    return nullcontext() if track else suspend_store_events()


def _quiet_start() -> None:
    """Our progress bar, not inspect_ai's; and inspect_ai's entry points not loaded: at start
    inspect_ai loads every installed package's (to find hooks), and inspect_evals' imports all
    of its evals, 780 modules and 2 s of a run's start. τ²'s modules are imported directly and
    our provider registers itself; nothing else is needed."""
    import inspect_ai._util.entrypoints as entrypoints
    from inspect_ai.util._display import init_display_type

    init_display_type("none")
    entrypoints._inspect_ai_eps_loaded_all = True
