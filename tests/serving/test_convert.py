import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from astra_agent.errors import CheckpointError, ConfigError
from serving.convert import convert_checkpoint, parse_size


def load_dir(d: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def assert_bf16_of(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
    assert src.keys() == dst.keys()
    for name, t in src.items():
        got = dst[name]
        if t.is_floating_point():
            assert got.dtype == torch.bfloat16, name
            # bit-exact against torch's own rounding
            assert torch.equal(t.to(torch.bfloat16).view(torch.int16), got.view(torch.int16)), name
        else:
            assert got.dtype == t.dtype and torch.equal(got, t), name


def test_tiny_bit_exact_with_index_and_files(tiny_fp32: Path, tmp_path: Path) -> None:
    res = convert_checkpoint(tiny_fp32, tmp_path / "bf16", max_shard_size="300KB")
    out = res.dst
    assert_bf16_of(load_dir(tiny_fp32), load_dir(out))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == res.shards > 1
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    assert index["metadata"]["total_size"] == res.bytes_written
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16"
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        assert (out / name).read_bytes() == (tiny_fp32 / name).read_bytes()
    # the result loads in transformers as bf16
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_random_multishard_bit_exact(random_fp32: Path, tmp_path: Path) -> None:
    src_shards = list(random_fp32.glob("*.safetensors"))
    assert len(src_shards) >= 3
    out = convert_checkpoint(random_fp32, tmp_path / "o").dst
    assert_bf16_of(load_dir(random_fp32), load_dir(out))


def _handmade(root: Path, shards: int = 3) -> dict[str, torch.Tensor]:
    """A multi-shard fp32 checkpoint with non-float tensors, special values and odd shapes."""
    torch.manual_seed(3)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3", "torch_dtype": "float32"}))
    tensors = {
        "a.weight": torch.randn(300, 70) * 1e3,
        "b.weight": torch.tensor(
            [0.0, -0.0, 1e-40, float("inf"), -float("inf"), 3.3e38, 1.0000001]
        ),
        "c.scalar": torch.tensor(2.5),
        "d.empty": torch.zeros(0, 4),
        "e.ids": torch.arange(10, dtype=torch.int64),
        "f.mask": torch.tensor([True, False]),
        "g.half": torch.randn(5, 5).half(),
        "h.nan": torch.tensor([float("nan")]),
    }
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, root / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tensors


def test_handmade_values_dtypes_and_torch_dtype_key(tmp_path: Path) -> None:
    src = _handmade(tmp_path / "src")
    out = convert_checkpoint(tmp_path / "src", tmp_path / "dst").dst
    got = load_dir(out)
    assert got["e.ids"].dtype == torch.int64 and got["f.mask"].dtype == torch.bool
    assert got["d.empty"].shape == (0, 4) and got["c.scalar"].shape == ()
    nan = got.pop("h.nan")
    assert torch.isnan(nan).all() and nan.dtype == torch.bfloat16
    src.pop("h.nan")
    assert_bf16_of(src, got)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"


def test_pytorch_bin_source(tmp_path: Path) -> None:
    src = tmp_path / "bin"
    src.mkdir()
    (src / "config.json").write_text("{}")
    tensors = {"x": torch.randn(64, 33), "y": torch.arange(3)}
    torch.save(tensors, src / "pytorch_model.bin")
    out = convert_checkpoint(src, tmp_path / "o").dst
    assert_bf16_of(tensors, load_dir(out))


def test_verl_fsdp_checkpoint_through_verls_merger(tiny_fp32: Path, tmp_path: Path) -> None:
    from serving.tiny import build_tiny_checkpoint

    root = build_tiny_checkpoint(tmp_path / "verl", layout="verl")
    res = convert_checkpoint(root, tmp_path / "o")  # the checkpoint root: latest step found
    assert res.source_kind == "verl-fsdp"
    assert_bf16_of(load_dir(tiny_fp32), load_dir(res.dst))
    assert (res.dst / "tokenizer.json").is_file()
    assert not list(tmp_path.glob(".o.*"))  # the merged fp32 intermediate is gone


# --------------------------------------------------------------------------- bad input


def _no_output(tmp_path: Path, name: str = "dst") -> None:
    assert not (tmp_path / name).exists()
    assert not list(tmp_path.glob(f".{name}.*"))


def _refused(src: Path, tmp_path: Path, match: str) -> None:
    """Converting ``src`` to ``tmp_path/dst`` fails with a ``CheckpointError`` matching
    ``match`` and leaves nothing behind."""
    with pytest.raises(CheckpointError, match=match):
        convert_checkpoint(src, tmp_path / "dst")
    _no_output(tmp_path)


@pytest.fixture
def random_copy(random_fp32: Path, tmp_path: Path) -> Path:
    """A copy of the random many-shard checkpoint, for a test to damage."""
    src = tmp_path / "src"
    shutil.copytree(random_fp32, src)
    return src


def test_src_missing(tmp_path: Path) -> None:
    _refused(tmp_path / "nope", tmp_path, "not found")


def test_src_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        convert_checkpoint(tmp_path / "src", tmp_path / "dst")
    (tmp_path / "src" / "config.json").write_text("{}")
    _refused(tmp_path / "src", tmp_path, "no weights")


def test_truncated_shard(random_copy: Path, tmp_path: Path) -> None:
    shard = sorted(random_copy.glob("*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 1000])
    _refused(random_copy, tmp_path, "truncated")


def test_corrupt_header(random_copy: Path, tmp_path: Path) -> None:
    shard = sorted(random_copy.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[8:20] = b"\x00garbage!!\xff\xfe"
    shard.write_bytes(bytes(data))
    _refused(random_copy, tmp_path, "corrupt")


def test_corrupt_bin(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    torch.save({"x": torch.randn(100, 100)}, src / "pytorch_model.bin")
    data = (src / "pytorch_model.bin").read_bytes()
    (src / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    _refused(src, tmp_path, "corrupt or truncated")


def test_index_names_missing_shard(random_copy: Path, tmp_path: Path) -> None:
    victim = sorted(random_copy.glob("*.safetensors"))[-1]
    victim.unlink()
    _refused(random_copy, tmp_path, f"missing: {victim.name}")


def test_a_disk_too_small_is_refused_before_anything_is_written(
    tiny_fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: full)
    with pytest.raises(ConfigError, match=r"not enough disk space at .*: need ≈[\d,]+ B, 1,000 B"):
        convert_checkpoint(tiny_fp32, tmp_path / "dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_dst_exists_needs_overwrite(tiny_fp32: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        convert_checkpoint(tiny_fp32, dst)
    assert (dst / "keep.txt").read_text() == "mine"
    convert_checkpoint(tiny_fp32, dst, overwrite=True)
    assert not (dst / "keep.txt").exists()
    assert (dst / "model.safetensors.index.json").is_file()
    assert not list(tmp_path.glob(".dst.*"))


def test_interrupted_run_leaves_no_dst(random_fp32: Path, tmp_path: Path) -> None:
    calls = []

    def progress(done: int, total: int, what: str) -> None:
        calls.append(done)
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(random_fp32, tmp_path / "dst", progress=progress)
    assert calls
    _no_output(tmp_path)


def test_killed_run_leaves_nothing_that_looks_complete(random_fp32: Path, tmp_path: Path) -> None:
    """kill -9 in the middle: DST is absent; the next run cleans the stale temp dir."""
    code = (
        "import sys, time\n"
        "from serving.convert import convert_checkpoint\n"
        "def slow(done, total, what):\n"
        "    print('progress', flush=True); time.sleep(0.2)\n"
        f"convert_checkpoint({str(random_fp32)!r}, {str(tmp_path / 'dst')!r}, progress=slow)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "progress"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "dst").exists()
    assert list(tmp_path.glob(".dst.converting-*"))  # the hidden partial directory
    convert_checkpoint(random_fp32, tmp_path / "dst")
    assert not list(tmp_path.glob(".dst.converting-*"))
    assert_bf16_of(load_dir(random_fp32), load_dir(tmp_path / "dst"))


def test_bad_options(tiny_fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unsupported dtype"):
        convert_checkpoint(tiny_fp32, tmp_path / "d", dtype="int8")
    with pytest.raises(ConfigError, match="not a size"):
        convert_checkpoint(tiny_fp32, tmp_path / "d", max_shard_size="lots")
    with pytest.raises(ConfigError, match="inside"):
        convert_checkpoint(tiny_fp32, tiny_fp32 / "sub")


def test_parse_size() -> None:
    assert parse_size("5GB") == 5_000_000_000
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("100") == 100
    assert parse_size(7) == 7
