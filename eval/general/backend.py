"""lm-eval's ``local-chat-completions`` backend, made to fit a thinking model behind an
OpenAI-compatible endpoint (imports lm-eval: load it lazily, through the runner).

What it changes, and why:

* the **answer** a task's filters see is the text after ``</think>``
  (:func:`~eval.general.thinking.answer_after_think`); the whole reply (its content, the
  reasoning the server returned separately, the finish reason) is kept per sample in
  :attr:`AstraChatLM.generations` for ``results.jsonl``;
* the **sampling** is the harness's (``ModelConfig``: temperature, top-p, top-k, min-p,
  ``max_tokens``, ``extra_body``), the same as every other eval here, not each task YAML's;
  a task's ``max_gen_toks`` applies when ``--max-tokens`` is not given;
* **stop sequences** (a task's ``until``) are not sent: the server would apply them to the
  reasoning too and cut it short; a chat model ends its turn by itself;
* an endpoint that fails (after our retries: lm-eval's are turned off) raises
  :class:`~eval.runner.EndpointDied`, once; a task that needs log-likelihoods (multiple
  choice) is refused by name (:class:`~astra_agent.errors.ConfigError`): a chat endpoint
  returns no prompt log-probs;
* a reply that is **not a chat completion** (a body that is not JSON or not UTF-8, HTML, a
  JSON list, ``{}``, ``choices: []``, a choice without a message or whose content is not text)
  is retried like a failed request; after the retries it is not an answer: its sample gets a
  :class:`Generation` with ``error`` set (an inference error, which the runner records and
  leaves out of the metrics), and the run goes on. A body is read by the shared client's rule
  (:func:`astra_agent.http_client.decode`, as synthesis reads it: UTF-8 JSON, whatever charset
  the reply claims) on lm-eval's sync path and on its async one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import requests
from lm_eval.models.openai_completions import LocalChatCompletion

from astra_agent import http_client
from astra_agent.errors import ConfigError
from eval.general.thinking import answer_after_think
from eval.runner import EndpointDied

log = logging.getLogger(__name__)
_TAG = "\x00astra-generation:"  # marks the generations parse_generations hands on


@dataclass(frozen=True)
class Generation:
    """One reply as the endpoint returned it."""

    content: str
    reasoning: str | None = None  # returned separately (a server-side reasoning parser)
    finish_reason: str | None = None
    error: str | None = None  # the reply was not a chat completion

    @property
    def answer(self) -> str:
        return answer_after_think(self.content)

    def encode(self) -> str:
        """As a string that survives lm-eval's plumbing between parse and generate_until."""
        return _TAG + json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> Generation:
        if isinstance(text, str) and text.startswith(_TAG):
            return cls(**json.loads(text[len(_TAG) :]))
        return cls(content=text if isinstance(text, str) else "")


class NotAChatCompletion(ValueError):
    """The endpoint answered, but its body is not a chat completion."""


def _excerpt(body: Any) -> str:
    try:
        text = json.dumps(body, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(body)
    return text if len(text) <= 200 else text[:200] + "…"


def completion_choices(body: Any) -> list[dict[str, Any]]:
    """The choices of a chat completion's body, in index order; :class:`NotAChatCompletion`
    saying what is wrong when it is not one."""
    if body is None:  # aiohttp reads an empty body as None
        raise NotAChatCompletion("the body is empty (or JSON null)")
    if not isinstance(body, dict):
        what = "a JSON list" if isinstance(body, list) else f"JSON {type(body).__name__}"
        raise NotAChatCompletion(f"the body is {what}, not an object: {_excerpt(body)}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise NotAChatCompletion(f"no choices: {_excerpt(body)}")
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise NotAChatCompletion(f"a choice without a message: {_excerpt(choice)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise NotAChatCompletion(f"the content is not text: {_excerpt(content)}")
    index = [c.get("index") for c in choices]
    if all(isinstance(i, int) and not isinstance(i, bool) for i in index):
        return sorted(choices, key=lambda c: int(c["index"]))
    return list(choices)


def _parse_choice(choice: dict[str, Any]) -> Generation:
    message = choice["message"]
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    finish = choice.get("finish_reason")
    return Generation(
        message.get("content") or "",
        reasoning if isinstance(reasoning, str) else None,
        finish if isinstance(finish, str) else None,
    )


def _bad_body(exc: BaseException) -> bool:
    """Did the endpoint answer with something that is not a chat completion? (Not JSON, not
    UTF-8, or JSON of another shape.)"""
    return isinstance(exc, NotAChatCompletion | http_client.NotJSON)


def _describe(exc: BaseException, timeout_s: float) -> str:
    if _bad_body(exc):
        return f"the reply is not a chat completion ({exc})"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status} {exc.message}".strip()
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code} {exc.response.reason or ''}".strip()
    if isinstance(exc, asyncio.TimeoutError | requests.Timeout):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, aiohttp.ClientConnectionError | requests.ConnectionError):
        return f"connection failed ({type(exc).__name__}: {exc})"
    return f"{type(exc).__name__}: {exc}"


_ENDPOINT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, requests.RequestException)


class _Unusable:
    """What the sync path hands lm-eval in place of a body that was never a chat completion
    (:meth:`AstraChatLM.parse_generations` turns it into error generations)."""

    def __init__(self, error: str) -> None:
        self.error = error


def _retryable(exc: BaseException) -> bool:
    """429, 5xx, refused or dropped connections, timeouts and replies that are not chat
    completions are worth another try; any other HTTP error (a 400 for a too-long prompt, a
    404 for a wrong model) is not."""
    if _bad_body(exc):
        return True
    status = getattr(exc, "status", None)
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        status = exc.response.status_code
    return status is None or status == 429 or status >= 500


class AstraChatLM(LocalChatCompletion):
    """``local-chat-completions`` with the harness's sampling and the answer after
    ``</think>``; ``generations[(task, doc_id)]`` holds the replies, in request order, and
    ``prompts[(task, doc_id)]`` the chat prompt sent (JSON).

    Retries are ours (``ModelConfig``: ``max_retries``, ``retry_backoff_s``, as every other
    client here), lm-eval's are off. Once a request has failed for good the run is over:
    :class:`EndpointDied` is raised once, and requests still in flight are cancelled."""

    def __init__(
        self,
        *,
        sampling: dict[str, Any],
        max_tokens: int | None,
        timeout_s: float,
        retries: int = 4,
        backoff_s: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            tokenizer_backend=None,
            tokenized_requests=False,
            eos_string="<|im_end|>",  # never sent (no stop sequences); silences a warning
            timeout=max(1, round(timeout_s)),
            max_retries=1,  # one attempt per lm-eval call: the retries are ours
            **kwargs,
        )
        self._sampling = sampling
        self._max_tokens = max_tokens
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self.generations: dict[tuple[str, int], list[Generation]] = {}
        self.prompts: dict[tuple[str, int], str] = {}  # the chat prompt (JSON), per sample
        self.started = False  # set by the first request lm-eval runs (tasks are loaded then)
        self.answered = 0  # requests the endpoint answered with a chat completion
        self.died: EndpointDied | None = None
        self._paused_until = 0.0  # monotonic time before which no request is sent

    def _create_payload(
        self,
        messages: list[dict[str, Any]],
        generate: bool = False,
        gen_kwargs: dict[str, Any] | None = None,
        seed: int = 1234,
        eos: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        gen = dict(gen_kwargs or {})
        gen.pop("until", None)
        payload: dict[str, Any] = super()._create_payload(
            messages, generate=generate, gen_kwargs=gen, seed=seed, eos=None
        )
        payload.pop("stop", None)
        payload.update(self._sampling)
        if self._max_tokens is not None:
            payload["max_tokens"] = self._max_tokens
        return payload

    def parse_generations(self, outputs: Any, **kwargs: Any) -> list[str]:
        """One encoded :class:`Generation` per choice of a chat completion (the async path
        calls this inside :meth:`amodel_call`, whose retries take a :class:`NotAChatCompletion`
        raised here); one error generation per request for a reply the retries could not make
        usable (the sync path)."""
        if isinstance(outputs, _Unusable):
            n = len(kwargs.get("contexts") or [None])
            return [Generation("", error=outputs.error).encode()] * n
        return [_parse_choice(c).encode() for c in completion_choices(outputs)]

    def _retry_delay(self, exc: BaseException, attempt: int) -> float | None:
        """Seconds before the next try, or None: give up (the run is over; a reply that is not
        a chat completion becomes its sample's error)."""
        if attempt >= self._retries or not _retryable(exc) or self.died is not None:
            return None
        return float(self._backoff_s * 2**attempt * (0.5 + random.random()))

    def _pause(self, exc: BaseException, attempt: int, delay: float) -> None:
        """Every request waits out a retry's delay, not only the one that failed: a failing
        endpoint sees one round of requests per retry, not a storm of them (said once a
        round)."""
        now = time.monotonic()
        if self._paused_until <= now:
            what = _describe(exc, self._timeout_s)
            log.warning("%s; retry %d in %.1f s", what, attempt + 1, delay)
        self._paused_until = max(self._paused_until, now + delay)

    async def _wait_pause(self) -> None:
        while (left := self._paused_until - time.monotonic()) > 0:
            await asyncio.sleep(left)

    def _give_up(self, exc: BaseException) -> BaseException:
        """The endpoint's failure, said once; requests failing after it are cancelled."""
        if self.died is not None:
            return asyncio.CancelledError()
        self.died = EndpointDied(
            f"{self.base_url}: {_describe(exc, self._timeout_s)} "
            f"(after {self.answered} answered requests)"
        )
        return self.died

    def _unusable(self, exc: BaseException, attempt: int) -> str:
        """A reply that is still not a chat completion after the retries: said, and kept as
        the sample's error (the run goes on)."""
        error = _describe(exc, self._timeout_s)
        tries = f"{attempt + 1} tr{'y' if attempt == 0 else 'ies'}"
        log.warning("%s: %s (%s): recorded as an inference error", self.base_url, error, tries)
        return error

    async def amodel_call(self, *args: Any, **kwargs: Any) -> Any:
        for attempt in itertools.count():
            await self._wait_pause()
            if self.died is not None:
                raise asyncio.CancelledError  # the run is over: no more requests
            try:
                result = await self._apost(*args, **kwargs)
            except Exception as exc:
                if self.died is not None:  # e.g. lm-eval closed the session: the run is over
                    raise asyncio.CancelledError from exc
                if not isinstance(exc, _ENDPOINT_ERRORS) and not _bad_body(exc):
                    raise
                delay = self._retry_delay(exc, attempt)
                if delay is None and _bad_body(exc):
                    error = Generation("", error=self._unusable(exc, attempt)).encode()
                    return [error] * len(kwargs.get("messages") or [None])
                if delay is None:
                    raise self._give_up(exc) from exc
                self._pause(exc, attempt, delay)
                continue
            self.answered += 1
            return result

    def _post(
        self, messages: Any, *, generate: bool = True, gen_kwargs: Any = None, **kwargs: Any
    ) -> Any:
        """lm-eval's sync request (one attempt), its body read by the shared client's rule:
        ``requests`` would decode a body that is not UTF-8 with U+FFFD."""
        payload = self._create_payload(
            self.create_message(messages), generate, gen_kwargs, self._seed, **kwargs
        )
        response = requests.post(
            self.base_url,
            json=payload,
            headers=self.header,
            verify=self.verify_certificate,
            timeout=self.timeout,
        )
        response.raise_for_status()
        return http_client.decode(response.content)

    async def _apost(
        self,
        session: aiohttp.ClientSession,
        sem: asyncio.Semaphore,
        messages: Any,
        *,
        cache_keys: list[Any] | None = None,
        gen_kwargs: Any = None,
        **kwargs: Any,
    ) -> list[str]:
        """lm-eval's async request (one attempt; generations only), its body read by the
        shared client's rule: aiohttp would decode it by the charset the reply claims."""
        kwargs.pop("generate", None)
        kwargs.pop("ctxlens", None)
        payload = self._create_payload(
            self.create_message(messages), True, gen_kwargs, self._seed, **kwargs
        )
        async with sem, session.post(self.base_url, json=payload, headers=self.header) as r:
            r.raise_for_status()
            body = http_client.decode(await r.read())
        answers = self.parse_generations(outputs=body)
        for answer, key in zip(answers, cache_keys or [], strict=False):
            self.cache_hook.add_partial("generate_until", key, answer)
        return answers

    def model_call(self, *args: Any, **kwargs: Any) -> Any:
        for attempt in itertools.count():
            try:
                result = self._post(*args, **kwargs)
                completion_choices(result)
            except Exception as exc:
                if not isinstance(exc, _ENDPOINT_ERRORS) and not _bad_body(exc):
                    raise
                delay = self._retry_delay(exc, attempt)
                if delay is None and _bad_body(exc):
                    return _Unusable(self._unusable(exc, attempt))
                if delay is None:
                    raise self._give_up(exc) from exc
                self._pause(exc, attempt, delay)
                time.sleep(delay)
                continue
            self.answered += 1
            return result

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        self.started = True
        try:
            texts = super().generate_until(requests, disable_tqdm)
        except (EndpointDied, asyncio.CancelledError):
            if self.died is None:
                raise
            raise self.died from None
        answers = []
        for req, text in zip(requests, texts, strict=True):
            gen = Generation.decode(text)
            key = (req.task_name, req.doc_id)
            self.generations.setdefault(key, []).append(gen)
            self.prompts[key] = str(getattr(req.args[0], "prompt", req.args[0]))
            answers.append(gen.answer)
        return answers

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> Any:
        self.started = True
        names = ", ".join(sorted({str(r.task_name) for r in requests}))
        raise ConfigError(
            f"{names}: not a generation task (it scores log-likelihoods, which a chat "
            "endpoint does not return)",
            hint="run generation tasks (output_type: generate_until), e.g. gsm8k, aime24",
        )

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> Any:
        return self.loglikelihood(requests, disable_tqdm)
