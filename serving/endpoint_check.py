"""Check that an OpenAI-compatible endpoint returns tool calls and reasoning as fields.

Works against any deployment: our own ``astra-serve up``, or a user's remote vLLM. Tags left in
``content`` (``<tool_call>``, ``<think>``) mean the server runs without the tool-call or
reasoning parser, which breaks every client: that is a failure, not a warning. So is the
opposite: a finished answer that came back only as reasoning, content empty (a model that does
not think, served with a reasoning parser).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from astra_agent.errors import ServerError
from astra_agent.model import ModelConfig, reasoning_field
from astra_agent.reply import only_in_reasoning

CHECK_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_time",
        "description": "Get the current time in a given IANA timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Paris"}},
            "required": ["timezone"],
        },
    },
}
CHECK_MESSAGES = [{"role": "user", "content": "What time is it in UTC? Use the tool."}]
TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
PROBE_TIMEOUT_S = 10.0  # listing models: a server that accepts but never answers fails fast


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not observed (neither right nor wrong)
    detail: str


@dataclass
class Reply:
    """What one chat request returned, streamed or not, reduced to what the check needs."""

    content: str = ""
    reasoning: str = ""
    reasoning_field: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class CheckReport:
    base_url: str
    model: str | None = None
    checks: list[Check] = field(default_factory=list)
    replies: dict[str, Reply] = field(default_factory=dict)

    def passed(self, strict: bool = False) -> bool:
        return all(c.ok or (c.ok is None and not strict) for c in self.checks)


def sampling_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """The sampling an agent run sends (ModelConfig's), as ``chat.completions.create`` takes it."""
    extra = {k: v for k, v in (("top_k", cfg.top_k), ("min_p", cfg.min_p)) if v is not None}
    return {
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "extra_body": {**extra, **cfg.extra_body},
    }


def _plain(client: Any, model: str, max_tokens: int, sampling: dict[str, Any]) -> Reply:
    r = client.chat.completions.create(
        model=model, messages=CHECK_MESSAGES, tools=[CHECK_TOOL], max_tokens=max_tokens, **sampling
    )
    msg = r.choices[0].message
    reasoning, where = reasoning_field(msg)
    calls = [
        {"name": tc.function.name, "arguments": tc.function.arguments}
        for tc in (msg.tool_calls or [])
    ]
    return Reply(msg.content or "", reasoning, where, calls, r.choices[0].finish_reason)


def _streamed(client: Any, model: str, max_tokens: int, sampling: dict[str, Any]) -> Reply:
    reply = Reply()
    calls: dict[int, dict[str, Any]] = {}
    stream = client.chat.completions.create(
        model=model,
        messages=CHECK_MESSAGES,
        tools=[CHECK_TOOL],
        max_tokens=max_tokens,
        stream=True,
        **sampling,
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        reply.content += delta.content or ""
        text, where = reasoning_field(delta)
        if text:
            reply.reasoning += text
            reply.reasoning_field = where
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function and tc.function.name:
                slot["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
        reply.finish_reason = choice.finish_reason or reply.finish_reason
    reply.tool_calls = [calls[i] for i in sorted(calls)]
    return reply


def _judge(kind: str, reply: Reply) -> list[Check]:
    out: list[Check] = []
    leaked = [t for t in TAGS if t in reply.content]
    if leaked:
        out.append(
            Check(
                f"{kind}: no raw tags in content",
                False,
                f"content carries {', '.join(leaked)}: is the server started with "
                "--enable-auto-tool-choice --tool-call-parser hermes "
                "--reasoning-parser qwen3?",
            )
        )
    if reply.tool_calls:
        bad = []
        for c in reply.tool_calls:
            try:
                json.loads(c["arguments"] or "{}")
            except json.JSONDecodeError:
                bad.append(c["name"])
        ok = not bad and all(c["name"] for c in reply.tool_calls)
        names = ", ".join(f"{c['name']}({c['arguments']})" for c in reply.tool_calls)
        out.append(
            Check(
                f"{kind}: structured tool_calls",
                ok,
                names if ok else f"unparseable arguments in {bad}",
            )
        )
    else:
        why = f"the model called no tool (finish_reason={reply.finish_reason})"
        out.append(Check(f"{kind}: structured tool_calls", None, why))
    calls = len(reply.tool_calls)
    if only_in_reasoning(reply.content, reply.reasoning, calls, reply.finish_reason):
        out.append(
            Check(
                f"{kind}: structured reasoning",
                False,
                f"the whole answer came back in `{reply.reasoning_field}`, content empty "
                f"({reply.reasoning[:60]!r}): the model does not think, but the server parses "
                "reasoning; serve it without a reasoning parser (astra-serve up --profile "
                "instruct-cpu, or reasoning_parser: null) or with enable_thinking: false",
            )
        )
    elif reply.reasoning_field:
        out.append(
            Check(
                f"{kind}: structured reasoning",
                True,
                f"in `{reply.reasoning_field}`: {reply.reasoning[:60]!r}",
            )
        )
    else:
        out.append(Check(f"{kind}: structured reasoning", None, "no reasoning returned"))
    return out


def _cause(exc: BaseException) -> str:
    """The innermost cause's words (the SDK's own message is a bare "Connection error.")."""
    seen: set[int] = set()
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _list_models(client: Any, base_url: str) -> list[str]:
    import openai

    try:
        return [m.id for m in client.with_options(timeout=PROBE_TIMEOUT_S).models.list()]
    except openai.AuthenticationError as exc:
        raise ServerError(f"{base_url} refused the API key: {exc}") from exc
    except openai.APITimeoutError as exc:
        raise ServerError(
            f"{base_url} accepted the connection but did not answer within {PROBE_TIMEOUT_S:.0f} s",
            hint="is it an OpenAI-compatible server, and is it still starting?",
        ) from exc
    except openai.APIConnectionError as exc:
        raise ServerError(
            f"cannot reach {base_url}: {_cause(exc)}",
            hint=f"is a server running at {base_url}? start one with `astra-serve up`",
        ) from exc
    except openai.APIError as exc:
        raise ServerError(f"{base_url}/models failed: {exc}") from exc


def check_endpoint(
    base_url: str,
    api_key: str | None = None,
    model: str | None = None,
    *,
    timeout: float = 120.0,
    max_tokens: int = 256,
    sampling: ModelConfig | None = None,
) -> CheckReport:
    """Run the endpoint checks with an agent's sampling (``sampling``, default ModelConfig's);
    raise ServerError only if the endpoint cannot be reached."""
    import openai

    client = openai.OpenAI(
        base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=1
    )
    report = CheckReport(base_url=base_url)
    models = _list_models(client, base_url)
    if model is not None and model not in models:
        report.checks.append(Check("models", False, f"{model!r} not served; served: {models}"))
        return report
    report.model = model or (models[0] if models else None)
    report.checks.append(Check("models", bool(models), ", ".join(models) or "none listed"))
    if report.model is None:
        return report
    kwargs = sampling_kwargs(sampling or ModelConfig())
    for kind, fn in (("chat", _plain), ("stream", _streamed)):
        try:
            reply = fn(client, report.model, max_tokens, kwargs)
        except openai.APIError as exc:
            report.checks.append(Check(f"{kind}: request", False, str(exc)[:300]))
            continue
        report.replies[kind] = reply
        report.checks.append(Check(f"{kind}: request", True, f"finish={reply.finish_reason}"))
        report.checks += _judge(kind, reply)
    return report
