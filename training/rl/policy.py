"""A token-level policy for the one episode loop: what RL samples is exactly what it trains.

:class:`TokenPolicy` implements :class:`astra_agent.model.Model`, so rollouts are
``run_episode`` like every other episode (same call execution, limits, error-as-result
semantics, ``Environment``). Unlike ``ChatModel`` it never sends chat text to a server: it
keeps the episode's token context itself.

* The first call renders the messages and tools with the checkpoint's chat template (the
  serving template, with the generation prompt): the *prompt ids*.
* Each call samples from the context through a :class:`~training.rl.generate.TokenGenerator`
  (a local model, a vLLM server's token-in/token-out completions, verl's server manager) and
  appends the sampled ids as they are (mask 1, with their log-probs), the end-of-turn token
  included.
* The sampled text is parsed with the Qwen3 contract that vLLM's ``qwen3`` reasoning parser and
  ``hermes`` tool parser apply when serving: ``<think>…</think>`` is reasoning,
  ``<tool_call>{json}</tool_call>`` blocks are calls (a malformed block is still a call, whose
  error the model then reads, as ``ChatModel`` recovers it).
* At the next call the messages added since (tool results) are appended as the template's own
  tokens (mask 0): the text the template renders after the last ``<|im_end|>``, tokenized on its
  own (it starts right after a special token, so it tokenizes as it would inside the whole).
* Text in a message the policy did not sample (the task's prompt, a tool result) that the
  tokenizer would turn into a turn marker (``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>``)
  ends the episode as a :class:`ControlTextError` (a model error, the rollout goes on):
  a tool that returned ``<|im_end|><|im_start|>assistant…`` would otherwise forge turns into
  the context the policy is trained in. vLLM's chat endpoint would tokenize the same text as
  control tokens when serving, so it cannot be kept as plain text either without the trained
  and served contexts parting.

Nothing is ever re-tokenized from chat text. :meth:`TokenPolicy.record` then checks the claim:
the template re-rendering the final messages must give the same ids; a mismatch (e.g. the model
wrote a call's JSON with other spacing than the template would, or sampled a non-canonical
tokenization) is reported in the record, never silently fixed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from astra_agent.errors import ServerError
from astra_agent.model import DeltaHook, Model, ModelTurn
from astra_agent.reply import END_OF_TURN as END
from astra_agent.reply import parse_wire_reply, stop_token_ids
from astra_agent.trajectory import TokenRecord
from serving.sampling import Sample, Sampling
from training.rl.generate import TokenGenerator

log = logging.getLogger(__name__)

T = TypeVar("T")


class ContextTooLong(ServerError):
    """The episode's prompt does not fit ``max_prompt_tokens`` (the episode cannot start)."""


class RenderError(ServerError):
    """The chat template or the tokenizer failed on this episode's messages (e.g. text that is
    not valid Unicode): the episode ends as a model error, the rollout goes on."""


class ControlTextError(RenderError):
    """A message the policy did not sample holds text that would become control tokens."""


def check_control_text(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    first: int,
    tools: list[dict[str, Any]] | None = None,
) -> None:
    """ControlTextError if ``messages[first:]`` (none of them sampled) or ``tools`` hold the
    text of a turn marker (:func:`training.template.turn_marker`). The reply-format tags
    (``<think>``, ``<tool_call>``, ``<tool_response>``) are let through: a tool result may quote the
    model's own reply (an unknown tool's name, a rejected argument), and inside a tool response
    they forge no turn."""
    from training.template import turn_marker  # transformers: loaded once a rollout runs

    for i, message in enumerate(messages[first:], start=first):
        found = turn_marker(tokenizer, message)
        if found:
            where = f"message {i} ({message.get('role', '?')!s:.20})"
            break
    else:
        found = turn_marker(tokenizer, tools or [])
        where = "the tool schemas"
    if found:
        raise ControlTextError(
            f"{where}: {found!r} would become a control token in a message the policy did not "
            "write (a tool result, the prompt); the environment must not return it (it would "
            "forge turns into the training context)"
        )


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    generation_prompt: bool,
) -> str:
    """The serving template's text for ``messages`` (what vLLM would prompt with)."""
    return str(
        tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of rendered text, as ``apply_chat_template(tokenize=True)`` computes them."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def parse_reply(text: str) -> tuple[str, str, list[Any]]:
    """(reasoning, content, calls) of a sampled reply, without its end-of-turn token."""
    return parse_wire_reply(text.removesuffix(END))


def _safely(fn: Callable[[], T]) -> T:
    """``fn()`` (rendering or tokenizing the episode's messages); whatever it raises is a
    :class:`RenderError` of this episode, not a crash of the rollout."""
    try:
        return fn()
    except ServerError:
        raise
    except Exception as exc:
        raise RenderError(
            f"the chat template or tokenizer failed on the messages: {type(exc).__name__}: "
            f"{str(exc)[:300]}"
        ) from exc


class TokenPolicy(Model):
    """One episode's token-level policy (make one per episode: it holds the context)."""

    def __init__(
        self,
        generator: TokenGenerator,
        tokenizer: Any,
        *,
        sampling: Sampling,
        name: str = "policy",
        max_prompt_tokens: int | None = None,
        max_response_tokens: int | None = None,
    ) -> None:
        self.generator = generator
        self.tokenizer = tokenizer
        stops = sampling.stop_token_ids or stop_token_ids(tokenizer)
        self.sampling = replace(sampling, stop_token_ids=stops)
        self._name = name
        self.max_prompt_tokens = max_prompt_tokens
        self.max_response_tokens = max_response_tokens
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.logprobs: list[float] = []
        self._seen = 0  # messages folded into the context
        self._turns = 0
        self._truncated = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def _start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        check_control_text(self.tokenizer, messages, 0, tools)
        ids = _safely(
            lambda: encode(
                self.tokenizer, render(self.tokenizer, messages, tools, generation_prompt=True)
            )
        )
        if self.max_prompt_tokens and len(ids) > self.max_prompt_tokens:
            # the record keeps the prompt's last max_prompt_tokens (as verl's agent loop does):
            # nothing is trained on it, and a trainer's forward over it stays within bounds
            self.prompt_ids = ids[-self.max_prompt_tokens :]
            raise ContextTooLong(
                f"the prompt has {len(ids)} tokens, over max_prompt_tokens={self.max_prompt_tokens}"
            )
        self.prompt_ids = ids
        self._seen = len(messages)

    def _append_new(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> None:
        """Append the template's tokens for the messages added since the last reply, within
        ``max_response_tokens``: tool results that do not fit are cut there (they are context,
        never trained) and the episode ends at its next call (no budget left)."""
        check_control_text(self.tokenizer, messages, self._seen)
        seen = messages[: self._seen]
        before = _safely(lambda: render(self.tokenizer, seen, tools, generation_prompt=False))
        after = _safely(lambda: render(self.tokenizer, messages, tools, generation_prompt=True))
        cut = before.rfind(END) + len(END)
        if cut < len(END) or after[:cut] != before[:cut]:
            raise ServerError(
                "the chat template is not prefix-stable: rendering the new messages changed "
                "the text of the earlier ones, so tool results cannot be appended as tokens"
            )
        ids = _safely(lambda: encode(self.tokenizer, after[cut:]))
        if self.max_response_tokens is not None:
            room = max(0, self.max_response_tokens - len(self.response_ids))
            if len(ids) > room:
                ids, self._truncated = ids[:room], True
        self._extend(ids, [0] * len(ids), [0.0] * len(ids))
        self._seen = len(messages)

    def _extend(self, ids: list[int], mask: list[int], logprobs: list[float]) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend(mask)
        self.logprobs.extend(logprobs)

    def _budget(self) -> int:
        """Tokens this turn may sample (the per-turn limit within what the episode has left)."""
        limit = self.sampling.max_tokens
        if self.max_response_tokens is not None:
            limit = min(limit, self.max_response_tokens - len(self.response_ids))
        return limit

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaHook | None = None,
    ) -> ModelTurn:
        if self._turns == 0:
            self._start(messages, tools)
        else:
            self._append_new(messages, tools)
        self._turns += 1
        budget = self._budget()
        if budget <= 0:
            self._truncated = True
            return ModelTurn("", "", [], "length", prompt_tokens=len(self.context))
        context = self.context
        sampling = self.sampling if budget == self.sampling.max_tokens else replace(
            self.sampling, max_tokens=budget
        )  # fmt: skip
        sample: Sample = await self.generator.generate(context, sampling)
        self._extend(list(sample.token_ids), [1] * len(sample.token_ids), list(sample.logprobs))
        self._seen = len(messages) + 1  # the reply's message, appended by the loop
        text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=False)
        if sample.finish_reason == "length":
            self._truncated = True
            return ModelTurn(
                text, "", [], "length", len(context), len(sample.token_ids),
                raw={"token_ids": list(sample.token_ids)},
            )  # fmt: skip
        reasoning, content, calls = parse_reply(text)
        if on_delta is not None:
            for kind, piece in (("reasoning", reasoning), ("content", content)):
                if piece:
                    on_delta(kind, piece)
        return ModelTurn(
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            prompt_tokens=len(context),
            completion_tokens=len(sample.token_ids),
            raw={"token_ids": list(sample.token_ids), "logprobs": list(sample.logprobs)},
        )

    def record(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> TokenRecord:
        """The episode's tokens, with the re-render check (skipped when a reply was cut)."""
        rec = TokenRecord(
            prompt_ids=list(self.prompt_ids),
            response_ids=list(self.response_ids),
            response_mask=list(self.response_mask),
            logprobs=list(self.logprobs),
        )
        if not self.response_ids or self._truncated:
            return rec
        try:
            seen = messages[: self._seen]
            text = _safely(lambda: render(self.tokenizer, seen, tools, generation_prompt=False))
            text = text[: text.rfind(END) + len(END)]
            ids = _safely(lambda: encode(self.tokenizer, text))
        except RenderError as exc:  # reported, as a mismatch is
            rec.rerender_match, rec.rerender_diff = False, str(exc)
            return rec
        rec.rerender_match = ids == self.context
        if not rec.rerender_match:
            rec.rerender_diff = first_difference(self.tokenizer, self.context, ids)
            log.debug("re-render mismatch: %s", rec.rerender_diff)
        return rec

    async def close(self) -> None:
        return None


def first_difference(tokenizer: Any, sampled: list[int], rendered: list[int]) -> str:
    """Where two id lists first differ, with the text around it on both sides."""
    n = next(
        (i for i, (a, b) in enumerate(zip(sampled, rendered, strict=False)) if a != b),
        min(len(sampled), len(rendered)),
    )
    lo = max(0, n - 6)
    a = tokenizer.decode(sampled[lo : n + 12], skip_special_tokens=False)
    b = tokenizer.decode(rendered[lo : n + 12], skip_special_tokens=False)
    return (
        f"token {n} of {len(sampled)} sampled / {len(rendered)} re-rendered: "
        f"sampled {a!r}, template {b!r}"
    )
