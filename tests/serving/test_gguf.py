"""`astra-serve import-gguf`: bad input refused in one line with nothing written, a killed import
leaving no output, and (on the real SmolLM2 file) what an import produces.

Small GGUF files are written here with the ``gguf`` package (llama.cpp's own writer): a header
with a byte-level BPE tokenizer and no tensors is enough to reach each check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.gguf import SMOLLM2, bundled_gguf, import_gguf, read_gguf
from tests.conftest import REPO, run_module

CHATML_NO_TOOLS = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}"
)


def write_gguf(
    path: Path, arch: str = "llama", *, end_of_turn: bool = True, template: str | None = None
) -> Path:
    """A GGUF header: ``arch``, a byte-level BPE vocabulary (with ``<|im_end|>`` or without),
    a one-block shape, no tensors."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    special = ["<|endoftext|>", "<|im_start|>", *(["<|im_end|>"] if end_of_turn else [])]
    plain = [*bytes_to_unicode().values(), "ĠĠ", "ĠĠĠĠ"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(plain + special)
    w.add_token_types([1] * len(plain) + [3] * len(special))
    w.add_token_merges(["Ġ Ġ", "ĠĠ ĠĠ"])
    w.add_bos_token_id(len(plain) + 1)
    w.add_eos_token_id(len(plain) + 1)
    if template:
        w.add_chat_template(template)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def refused(src: Path, dst: Path, *args: str) -> str:
    """Run the import as a user does; it must exit 2 with one error line and write nothing."""
    out = run_module("serving", "import-gguf", str(src), str(dst), *args, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert not dst.exists() and not list(dst.parent.glob(f".{dst.name}.*"))
    return " ".join(out.stderr.split())


@pytest.mark.integration
def test_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    src = tmp_path / "model.gguf"
    src.write_text('{"model_type": "llama"}')
    assert "is not a GGUF file (it starts with b'{\"mo'" in refused(src, tmp_path / "out")


@pytest.mark.integration
def test_an_architecture_transformers_cannot_read(tmp_path: Path) -> None:
    said = refused(write_gguf(tmp_path / "m.gguf", "rwkv7"), tmp_path / "out")
    assert "cannot read GGUF checkpoints of architecture 'rwkv7'" in said
    assert "llama" in said and "qwen3" in said and "general" not in said


@pytest.mark.integration
def test_a_tokenizer_without_an_end_of_turn_token(tmp_path: Path) -> None:
    said = refused(write_gguf(tmp_path / "m.gguf", end_of_turn=False), tmp_path / "out")
    assert "has no end-of-turn token <|im_end|>" in said


@pytest.mark.integration
def test_a_template_that_cannot_render_tools_and_a_file_without_weights(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "m.gguf", template=CHATML_NO_TOOLS)
    said = refused(src, tmp_path / "out", "--chat-template", "own")
    assert "the chat template of" in said and "cannot render tools" in said
    assert "--chat-template harness" in said
    # auto takes the harness's template and goes on, to weights this file does not hold:
    # refused, not initialised at random
    said = refused(src, tmp_path / "out")
    assert "lacks" in said and "tensor(s) the model needs" in said and "random" in said


def test_a_truncated_file(tmp_path: Path) -> None:
    whole = bundled_gguf(SMOLLM2)
    cut = tmp_path / "cut.gguf"
    with whole.open("rb") as f:
        cut.write_bytes(f.read(whole.stat().st_size // 2))
    with pytest.raises(Exception, match="truncated or corrupt"):
        read_gguf(cut)
    assert read_gguf(whole).architecture == "llama"


def test_an_existing_output_and_a_bad_dtype(tmp_path: Path) -> None:
    from astra_agent.errors import ConfigError

    src = write_gguf(tmp_path / "m.gguf")
    (tmp_path / "out").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        import_gguf(src, tmp_path / "out")
    with pytest.raises(ConfigError, match="unsupported dtype 'float16'"):
        import_gguf(src, tmp_path / "other", dtype="float16")


def test_a_disk_too_small_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from astra_agent.errors import ConfigError

    src = bundled_gguf(SMOLLM2)  # read for its size only: nothing is dequantized
    full = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: full)
    with pytest.raises(ConfigError, match=r"not enough disk space at .*: need ≈[\d,]+ B, 1,000 B"):
        import_gguf(src, tmp_path / "out" / "model")
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.integration
def test_an_import_killed_midway_leaves_nothing_and_the_next_one_completes(
    tmp_path: Path,
) -> None:
    dst = tmp_path / "smollm2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving", "import-gguf", SMOLLM2, str(dst), "--dtype", "float32"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob(".smollm2.importing-*/*.safetensors")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not dst.exists() and list(tmp_path.glob(".smollm2.importing-*"))  # only the temp
    result = import_gguf(SMOLLM2, dst, dtype="float32")
    assert result.dtype == "float32" and (dst / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".smollm2.importing-*"))  # the dead run's temp removed
    assert result.bytes_written == 134_515_008 * 4


PARSE_IN_PIECES = """
import json, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
tok = AutoTokenizer.from_pretrained(sys.argv[1])
tools = [{"type": "function", "function": {"name": "get_x", "parameters": {"type": "object"}}}]
req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "q"}], tools=tools)
text = sys.argv[2]
plain = Hermes2ProToolParser(tok).extract_tool_calls(text, req)
ids = tok.encode(text, add_special_tokens=False)
parser, prev, calls, content = Hermes2ProToolParser(tok), "", {}, ""
for i in range(len(ids)):
    cur = tok.decode(ids[: i + 1])
    d = parser.extract_tool_calls_streaming(prev, cur, cur[len(prev):], ids[:i], ids[: i + 1],
                                            [ids[i]], req)
    for tc in (d.tool_calls or []) if d else []:
        slot = calls.setdefault(tc.index, ["", ""])
        slot[0] += (tc.function.name or "") if tc.function else ""
        slot[1] += (tc.function.arguments or "") if tc.function else ""
    content += (d.content or "") if d else ""
    prev = cur
print(json.dumps({"pieces": len(tok.encode("<tool_call>", add_special_tokens=False)),
                  "plain": [[c.function.name, c.function.arguments] for c in plain.tool_calls],
                  "plain_content": plain.content, "stream": calls[0] if calls else None,
                  "stream_content": content}))
"""


@pytest.mark.integration
def test_vllms_tool_parser_reads_tags_spelt_in_pieces(smollm2_bf16: Path) -> None:
    """Why no tokens are added: vLLM's hermes parser finds a call whose tags are several
    tokens each (SmolLM2's vocabulary), in a whole reply and streamed token by token."""
    from serving.server import ServeConfig, serving_python

    call = '{"name": "get_x", "arguments": {"id": "ORD-4821"}}'
    text = f"Let me look.\n<tool_call>\n{call}\n</tool_call>"
    python = serving_python(ServeConfig())
    out = subprocess.run([python, "-c", PARSE_IN_PIECES, str(smollm2_bf16), text],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["pieces"] == 5
    assert got["plain"] == [["get_x", '{"id": "ORD-4821"}']]
    assert got["stream"] == ["get_x", '{"id": "ORD-4821"}']
    assert got["plain_content"] == got["stream_content"] == "Let me look.\n"
