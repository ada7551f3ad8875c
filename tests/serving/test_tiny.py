import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from astra_agent.errors import ConfigError
from serving.tiny import SPECIAL_TOKENS, TAG_TOKENS, Script, TinySpec, build_tiny_checkpoint

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_time",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}},
        },
    }
]


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_deterministic_from_seed(tmp_path: Path, tiny_fp32: Path) -> None:
    again = build_tiny_checkpoint(tmp_path / "again")
    assert _digest(again) == _digest(tiny_fp32)
    other = build_tiny_checkpoint(tmp_path / "other", TinySpec(seed=1))
    assert _digest(other) != _digest(tiny_fp32)


def test_layout_float32_sharded_as_verl_merger_writes(tiny_fp32: Path) -> None:
    cfg = json.loads((tiny_fp32 / "config.json").read_text())
    assert cfg["dtype"] == "float32" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    index = json.loads((tiny_fp32 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = AutoModelForCausalLM.from_pretrained(tiny_fp32)
    n = sum(p.numel() for p in model.parameters())
    assert n < 10_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    gen = json.loads((tiny_fp32 / "generation_config.json").read_text())
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (0.6, 0.95, 20)


def test_special_tokens_are_single_tokens(tiny_fp32: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_fp32)
    for t in SPECIAL_TOKENS + TAG_TOKENS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, t
    # Tags must survive skip_special_tokens (vLLM decodes that way before parsing).
    ids = tok("<think>x</think><tool_call>{}</tool_call>", add_special_tokens=False)["input_ids"]
    assert "<tool_call>" in tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(tok("<|im_end|>")["input_ids"], skip_special_tokens=True) == ""
    assert tok.eos_token == "<|im_end|>"


def test_chat_template_renders_qwen3_format(tiny_fp32: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_fp32)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer", "reasoning_content": "OLD-THOUGHT"},
        {"role": "user", "content": "time?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "NEW-THOUGHT",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"type": "function", "function": {"name": "g", "arguments": {"b": 2}}},
            ],
        },
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
    ]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '"name": "get_current_time"' in text.split("\n</tools>")[0]
    assert "OLD-THOUGHT" not in text  # earlier turns' reasoning is dropped
    assert "<think>\nNEW-THOUGHT\n</think>\n\n" in text  # the current loop's is kept
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>' in text
    assert '{"name": "g", "arguments": {"b": 2}}' in text
    assert (
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
        "<tool_response>\nr2\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")
    off = tok.apply_chat_template(
        msgs[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def _generate(model_dir: Path, msgs: list[dict], sample: bool) -> str:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**ids, max_new_tokens=60, do_sample=sample, temperature=1.0, top_k=0)
    return tok.decode(out[0][ids["input_ids"].shape[1] :])


@pytest.mark.parametrize("sample", [False, True])
def test_scripted_model_thinks_then_calls_then_answers(tiny_fp32: Path, sample: bool) -> None:
    msgs = [{"role": "user", "content": "What time is it in Tokyo, please? " * 20}]
    first = _generate(tiny_fp32, msgs, sample)
    call = '{"name":"get_current_time","arguments":{"timezone": "UTC"}}'
    assert (
        first == f"<think>Calling the time tool now</think><tool_call>{call}</tool_call><|im_end|>"
    )
    msgs += [
        {"role": "assistant", "content": first.removesuffix("<|im_end|>")},
        {"role": "tool", "content": "2026-11-30T12:00:00Z"},
    ]
    second = _generate(tiny_fp32, msgs, sample)
    assert second == "<think></think>Finished: result above<|im_end|>"


def test_scripted_model_follows_custom_script(tmp_path: Path) -> None:
    script = Script(tool_name="read_file", arguments={"path": "/tmp/a"}, answer="All good")
    out = build_tiny_checkpoint(tmp_path / "m", TinySpec(script=script))
    text = _generate(out, [{"role": "user", "content": "hi"}], sample=False)
    assert '{"name":"read_file","arguments":{"path": "/tmp/a"}}' in text


def test_script_with_repeated_tokens_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="repeats tokens"):
        build_tiny_checkpoint(tmp_path / "m", TinySpec(script=Script(reasoning="a a a a")))
    assert not (tmp_path / "m").exists()
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        build_tiny_checkpoint(tmp_path / "m")


def test_verl_layout(tmp_path: Path) -> None:
    root = build_tiny_checkpoint(tmp_path / "v", layout="verl")
    actor = root / "global_step_1" / "actor"
    assert (actor / "model_world_size_1_rank_0.pt").is_file()
    assert json.loads((actor / "fsdp_config.json").read_text())["world_size"] == 1
    assert (actor / "huggingface" / "config.json").is_file()
    assert (actor / "huggingface" / "tokenizer.json").is_file()
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "1"
