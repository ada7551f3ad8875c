"""Our :class:`~astra_agent.model.ChatModel` as an inspect_ai model provider: τ²'s agent and
its user simulator reach their endpoints through it, so the Qwen3 contract, the retries and the
error kinds are the harness's own (inspect_ai's OpenAI provider drops vLLM's
``reasoning_content``, and its token counting downloads tiktoken's encodings at run time).

Two things τ²'s loop does not do, done here:

* **usage is the server's**: each reply carries the endpoint's token counts, so inspect_ai never
  counts tokens itself (offline-safe);
* **an endpoint failure is not a move of the conversation**: τ²'s loop catches every exception
  and goes on (up to its message limit), and a conversation cut short would be scored as the
  agent's failure. The first failure of a conversation is written to the sample's store
  (:data:`FAILURE`) and every call after it ends the conversation (``###STOP###``); the runner
  records such a conversation as an error, unscored.

Sampling is the :class:`~astra_agent.model.ModelConfig`'s (what ``astra-eval tau2`` was given,
recorded in the run's fingerprint), not the ``temperature=0`` τ²'s code asks inspect_ai for.
"""

from __future__ import annotations

import json
from typing import Any

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
from inspect_ai.tool import ToolCall, ToolChoice, ToolInfo
from inspect_ai.util import store

from astra_agent.errors import ServerError
from astra_agent.model import ChatModel, EndpointError, ModelTurn

FAILURE = "astra_tau2_failure"  # the conversation's first endpoint failure: {side, error, kind}
SAMPLE = "astra_tau2_sample"  # the conversation's id, sent as each request's ``user``
USAGE = "astra_tau2_usage"  # {side: {prompt_tokens, completion_tokens, calls}}
AGENT_TOOLS = "astra_tau2_agent_tools"  # the tools the agent was offered, as it was sent them
OVER = "astra_tau2_max_steps"  # set once the conversation's model calls reached max_steps
STOP = "###STOP###"


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
        sample = store()
        if sample.get(FAILURE) is not None or sample.get(OVER):
            return _stop(self.chat.name)
        usage = sample.get(USAGE) or {}
        if sum(side["calls"] for side in usage.values()) >= self.max_steps:
            # τ²'s agent loops for as long as the model calls tools: a model that never stops
            # ends here, scored as it stands (τ²'s own max_steps)
            sample.set(OVER, True)
            return _stop(self.chat.name)
        schemas = to_tools(tools)
        if self.side == "agent" and sample.get(AGENT_TOOLS) is None:
            sample.set(AGENT_TOOLS, schemas)
        try:
            turn = await self.chat.complete(
                to_messages(input), schemas or None, user=sample.get(SAMPLE)
            )
        except ServerError as exc:
            kind = exc.kind if isinstance(exc, EndpointError) else "other"
            sample.set(FAILURE, {"side": self.side, "error": str(exc), "kind": kind})
            return _stop(self.chat.name)
        mine = usage.setdefault(self.side, {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0})
        mine["prompt_tokens"] += turn.prompt_tokens
        mine["completion_tokens"] += turn.completion_tokens
        mine["calls"] += 1
        sample.set(USAGE, usage)
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
