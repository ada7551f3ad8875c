"""Tiny Qwen3 checkpoints built locally, deterministically from a seed.

Nothing can be downloaded here, so tests, CI and the README's demo run the real serving path on
a checkpoint of a few hundred thousand parameters built in seconds:

* a byte-level BPE tokenizer trained with ``tokenizers`` on a generated corpus that covers chat
  and tool-call text, with Qwen3's special tokens as single tokens;
* the Qwen3 chat template format (``chat_template.jinja`` beside this module);
* a ``Qwen3ForCausalLM`` saved in **float32** in the layout verl's model merger writes (sharded
  safetensors + index), optionally also as a verl FSDP actor directory.

``behavior="scripted"`` sets some weights by hand so that the model, greedy or sampled, answers
any prompt with ``<think>REASONING</think><tool_call>{CALL}</tool_call>`` and, once a tool
response is in the context, with ``ANSWER``. It is a bigram chain over one-hot embeddings, plus
one attention head that raises a flag when a ``<tool_response>`` token is anywhere in the
context. This is how the server's reasoning and tool-call parsers are tested end to end.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from astra_agent.runio import building_dir

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
# The pre-tokenizer split Qwen2/Qwen3 use (identifiers keep a leading punctuation mark).
QWEN2_PRETOKENIZE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

# Qwen3's recommended sampling for thinking mode.
QWEN3_THINKING_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}


@dataclass(frozen=True)
class Script:
    """What a scripted tiny model says. Every token of each chain must be distinct."""

    reasoning: str = "Calling the time tool now"
    tool_name: str = "get_current_time"
    arguments: dict[str, Any] = field(default_factory=lambda: {"timezone": "UTC"})
    answer: str = "Finished: result above"

    def call_text(self) -> str:
        # Compact JSON with one space before the last value: this keeps every BPE piece
        # of the call distinct, which the bigram chain needs.
        args = json.dumps(self.arguments, separators=(",", ": "))
        return '{"name":' + json.dumps(self.tool_name) + ',"arguments":' + args + "}"


@dataclass(frozen=True)
class TinySpec:
    """Shape and behaviour of a tiny checkpoint (defaults: ≈0.9 M parameters)."""

    seed: int = 0
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 32768
    behavior: str = "scripted"  # or "random"
    script: Script = field(default_factory=Script)
    max_shard_size: str = "512KB"


# --------------------------------------------------------------------------- tokenizer


def _corpus(seed: int, script: Script) -> list[str]:
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "user",
        "assistant",
        "tool",
        "call",
        "result",
        "weather",
        "city",
        "time",
        "timezone",
        "date",
        "file",
        "path",
        "read",
        "write",
        "list",
        "search",
        "name",
        "value",
        "book",
        "flight",
        "hotel",
        "order",
        "account",
        "balance",
        "price",
        "stock",
        "item",
        "id",
        "query",
        "answer",
        "think",
        "reason",
        "step",
        "first",
        "then",
        "next",
        "final",
        "error",
        "ok",
        "yes",
        "no",
        "please",
        "can",
        "you",
        "what",
        "when",
        "where",
        "how",
        "is",
        "are",
        "was",
        "get",
        "set",
        "create",
        "delete",
        "update",
        "find",
    ]
    cities = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "UTC", "Europe"]
    lines: list[str] = []
    for _ in range(3000):
        n = rng.randint(3, 12)
        lines.append(" ".join(rng.choice(words) for _ in range(n)).capitalize() + ".")
        fn = f"{rng.choice(words)}_{rng.choice(words)}"
        args = {rng.choice(words): rng.choice([*cities, str(rng.randint(0, 999))])}
        lines.append(json.dumps({"name": fn, "arguments": args}))
        lines.append(
            json.dumps(
                {
                    "type": "function",
                    "function": {
                        "name": fn,
                        "parameters": {
                            "type": "object",
                            "properties": {k: {"type": "string"} for k in args},
                        },
                    },
                }
            )
        )
    # The scripted chains, often enough that their pieces become single tokens.
    lines += [script.reasoning, script.call_text(), script.answer] * 200
    lines += ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"] * 50
    return lines


def build_tokenizer(seed: int, vocab_size: int, script: Script) -> Any:
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    n_added = len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_added,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, script), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = TEMPLATE_PATH.read_text(encoding="utf-8")
    return fast


# --------------------------------------------------------------------------- model


def _config(spec: TinySpec, tokenizer: Any) -> Any:
    from transformers import Qwen3Config

    vocab = max(spec.vocab_size, len(tokenizer))
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        dtype="float32",
    )


def _chains(tokenizer: Any, script: Script) -> tuple[list[int], list[int], int]:
    """Token ids of the two chains (before / after a tool response) and of <tool_response>.

    Each chain starts with the last token of the generation prompt; the model maps every token
    of a chain to the next one. The answer chain opens with an empty think block, as Qwen3 does.
    """
    ids = tokenizer.convert_tokens_to_ids
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    start = tokenizer(prompt, add_special_tokens=False)["input_ids"][-1]

    def enc(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    think, end_think, end = ids("<think>"), ids("</think>"), ids("<|im_end|>")
    call = [start, think, *enc(script.reasoning), end_think, ids("<tool_call>")]
    call += [*enc(script.call_text()), ids("</tool_call>"), end]
    answer = [start, think, end_think, *enc(script.answer), end]
    for chain in (call, answer):
        preds = chain[:-1]
        if len(set(preds)) != len(preds):
            dup = sorted({tokenizer.convert_ids_to_tokens(t) for t in preds if preds.count(t) > 1})
            raise ConfigError(
                f"the script repeats tokens {dup}; a scripted tiny model needs every token "
                "of its reasoning and call, and of its answer, to be distinct",
                hint="reword the reasoning/answer or change the call's arguments",
            )
    return call, answer, ids("<tool_response>")


def _script_weights(model: Any, tokenizer: Any, spec: TinySpec) -> None:
    """Overwrite weights so that generation follows the script.

    Residual-stream dimensions reserved for the script: one per chain token (one-hot
    embeddings), a constant ``c``, the flag ``r``, ``<tool_response>``, and one per token that
    both chains use (``v_p``: "p with the flag raised"). Layer 0's attention raises ``r`` when a
    ``<tool_response>`` is anywhere in the context; layer 0's MLP turns ``p`` and ``r`` into
    ``v_p``; everything else adds nothing, so the head sees the current token (and the flag) and
    maps it to the next one.
    """
    import torch

    call, answer, resp = _chains(tokenizer, spec.script)
    preds = list(dict.fromkeys(call[:-1] + answer[:-1]))
    shared = [t for t in answer[:-1] if t in set(call[:-1])]
    d, hd = spec.hidden_size, spec.head_dim
    reserved = len(preds) + 3 + len(shared)
    if reserved > d or len(shared) > spec.intermediate_size:
        raise ConfigError(f"script too long for hidden_size {d}: needs {reserved} dimensions")
    dim = {tok: i for i, tok in enumerate(preds)}
    c_dim, r_dim, resp_dim = len(preds), len(preds) + 1, len(preds) + 2
    v_dim = {tok: resp_dim + 1 + i for i, tok in enumerate(shared)}
    big = 4.0
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, :reserved] = 0.0
        for tok, i in dim.items():
            emb[tok].zero_()
            emb[tok, i] = emb[tok, c_dim] = 1.0
        emb[resp].zero_()
        emb[resp, resp_dim] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        attn = model.model.layers[0].self_attn
        i0 = hd // 2 - 1  # the lowest RoPE frequency: position barely matters
        attn.q_proj.weight[:hd].zero_()
        attn.q_proj.weight[i0, c_dim] = 1.0
        attn.k_proj.weight[:hd].zero_()
        attn.k_proj.weight[i0, resp_dim] = 1.0
        attn.q_norm.weight.fill_(4.0)
        attn.k_norm.weight.fill_(4.0)
        attn.v_proj.weight[:hd].zero_()
        attn.v_proj.weight[0, resp_dim] = d**-0.5
        attn.o_proj.weight[r_dim, 0] = 1.0
        mlp = model.model.layers[0].mlp
        for n, tok in enumerate(shared):  # neuron n fires only for (tok, flag)
            mlp.gate_proj.weight[n].zero_()
            mlp.gate_proj.weight[n, dim[tok]] = mlp.gate_proj.weight[n, r_dim] = 10.0
            mlp.gate_proj.weight[n, c_dim] = -15.0
            mlp.up_proj.weight[n].zero_()
            mlp.up_proj.weight[n, c_dim] = 1.0
            mlp.down_proj.weight[v_dim[tok], n] = 3.0 / 200.0
        head = model.lm_head.weight
        head[:, :reserved] = 0.0
        for pred, succ in itertools.pairwise(call):
            head[succ, dim[pred]] += 2 * big
        for pred, succ in itertools.pairwise(answer):
            head[succ, v_dim.get(pred, dim[pred])] += 2 * big


# --------------------------------------------------------------------------- writing


def _generation_config(tokenizer: Any) -> dict[str, Any]:
    ids = tokenizer.convert_tokens_to_ids
    return {
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": [ids("<|im_end|>"), ids("<|endoftext|>")],
        "pad_token_id": ids("<|endoftext|>"),
        "do_sample": True,
        **{k: v for k, v in QWEN3_THINKING_SAMPLING.items() if k != "min_p"},
    }


def _write_verl_layout(model: Any, hf_dir: Path, root: Path, step: int = 1) -> None:
    """What verl's FSDP checkpoint manager writes for world size 1, moved from ``hf_dir``."""
    import torch

    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    for f in list(hf_dir.iterdir()):
        if f.is_file():
            if f.name.startswith("model"):
                f.unlink()
            else:
                f.rename(actor / "huggingface" / f.name)
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))


def build_tiny_checkpoint(
    out: str | Path,
    spec: TinySpec | None = None,
    *,
    layout: str = "hf",
    overwrite: bool = False,
) -> Path:
    """Build a tiny float32 Qwen3 checkpoint into ``out`` (atomically) and return its path.

    ``layout="hf"`` writes what verl's model merger writes (sharded safetensors, index, config,
    tokenizer); ``layout="verl"`` writes a verl FSDP checkpoint instead
    (``out/global_step_1/actor`` with the rank file, ``fsdp_config.json`` and ``huggingface/``).
    """
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = spec or TinySpec()
    if layout not in ("hf", "verl"):
        raise ConfigError(f"unknown layout {layout!r}: use 'hf' or 'verl'")
    if spec.behavior not in ("scripted", "random"):
        raise ConfigError(f"unknown behavior {spec.behavior!r}: use 'scripted' or 'random'")
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} already exists", hint="pass --overwrite to replace it")
    with building_dir(out) as tmp:
        tokenizer = build_tokenizer(spec.seed, spec.vocab_size, spec.script)
        config = _config(spec, tokenizer)
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config).float().eval()
        if spec.behavior == "scripted":
            _script_weights(model, tokenizer, spec)
        model.save_pretrained(tmp, max_shard_size=spec.max_shard_size)
        tokenizer.save_pretrained(tmp)
        (tmp / "generation_config.json").write_text(
            json.dumps(_generation_config(tokenizer), indent=2) + "\n"
        )
        _force_fp32_config(tmp / "config.json")
        if layout == "verl":
            _write_verl_layout(model, tmp, tmp)
    n = sum(p.numel() for p in model.parameters())
    log.info("built tiny %s checkpoint (%d parameters) at %s", spec.behavior, n, out)
    return out


def _force_fp32_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    cfg["dtype"] = "float32"
    cfg.pop("torch_dtype", None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
