"""Benchmark: streaming fp32 → bf16 conversion against the naive transformers way.

Builds a synthetic float32 Qwen3 checkpoint (default ≈4.4 GB in 4 shards), then converts it
(1) with ``from_pretrained(dtype=bfloat16)`` + ``save_pretrained`` and (2) with
``astra-serve convert``, each in its own process, and prints wall time and peak RSS side by
side. Targets: our peak RSS under 1.5 × the largest input shard, and wall time no worse than
the naive way's.

    .venv/bin/python bench/convert.py [--layers 18] [--workdir bench/out/convert]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"
# VmHWM (peak RSS of this process image); ru_maxrss would carry the parent's over exec.
NAIVE = """
import sys, time, torch
from transformers import AutoModelForCausalLM
t = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
m.save_pretrained(sys.argv[2])
print(time.perf_counter() - t, PEAK)
"""
OURS = """
import sys, time
from serving.convert import convert_checkpoint
t = time.perf_counter()
convert_checkpoint(sys.argv[1], sys.argv[2])
print(time.perf_counter() - t, PEAK)
"""


def make_checkpoint(root: Path, layers: int, hidden: int, inter: int, vocab: int) -> int:
    """A float32 Qwen3 checkpoint written shard by shard; returns the largest shard's bytes."""
    from transformers import Qwen3Config

    root.mkdir(parents=True)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 128,
        head_dim=128,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.save_pretrained(root)
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    groups: list[dict[str, torch.Tensor]] = [{"model.embed_tokens.weight": rnd(vocab, hidden)}]
    per_shard = max(1, layers // 4)
    for i in range(layers):
        if i % per_shard == 0 and i:
            groups.append({})
        p = f"model.layers.{i}."
        groups[-1].update(
            {
                p + "self_attn.q_proj.weight": rnd(hidden, hidden),
                p + "self_attn.k_proj.weight": rnd(hidden, hidden),
                p + "self_attn.v_proj.weight": rnd(hidden, hidden),
                p + "self_attn.o_proj.weight": rnd(hidden, hidden),
                p + "self_attn.q_norm.weight": torch.ones(128),
                p + "self_attn.k_norm.weight": torch.ones(128),
                p + "mlp.gate_proj.weight": rnd(inter, hidden),
                p + "mlp.up_proj.weight": rnd(inter, hidden),
                p + "mlp.down_proj.weight": rnd(hidden, inter),
                p + "input_layernorm.weight": torch.ones(hidden),
                p + "post_attention_layernorm.weight": torch.ones(hidden),
            }
        )
    groups[-1].update(
        {"model.norm.weight": torch.ones(hidden), "lm_head.weight": rnd(vocab, hidden)}
    )
    weight_map, largest = {}, 0
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, root / name, metadata={"format": "pt"})
        largest = max(largest, (root / name).stat().st_size)
        weight_map.update(dict.fromkeys(group, name))
        group.clear()
    total = sum(p.stat().st_size for p in root.glob("*.safetensors"))
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return largest


def run(code: str, src: Path, dst: Path) -> tuple[float, int]:
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["cat", *map(str, src.glob("*.safetensors"))], stdout=subprocess.DEVNULL)
    code = code.replace("PEAK", PEAK)
    out = subprocess.run(
        [sys.executable, "-c", code, str(src), str(dst)], capture_output=True, text=True, check=True
    )
    wall, rss = out.stdout.strip().splitlines()[-1].split()
    return float(wall), int(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--workdir", type=Path, default=Path("bench/out/convert"))
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint")
    args = ap.parse_args()
    src = args.workdir / "fp32"
    shutil.rmtree(args.workdir, ignore_errors=True)
    t = time.perf_counter()
    largest = make_checkpoint(src, args.layers, args.hidden, args.intermediate, args.vocab)
    total = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    shards = len(list(src.glob("*.safetensors")))
    print(
        f"synthetic fp32 checkpoint: {total / 1e9:.2f} GB in {shards} shards, "
        f"largest {largest / 1e9:.2f} GB (built in {time.perf_counter() - t:.0f} s)"
    )
    naive_t, naive_rss = run(NAIVE, src, args.workdir / "naive")
    ours_t, ours_rss = run(OURS, src, args.workdir / "ours")
    print(f"{'method':<34}{'wall s':>9}{'peak RSS GB':>13}{'RSS/largest shard':>19}")
    for name, w, r in (
        ("naive from_pretrained+save", naive_t, naive_rss),
        ("astra-serve convert", ours_t, ours_rss),
    ):
        print(f"{name:<34}{w:>9.1f}{r / 1e9:>13.2f}{r / largest:>19.2f}")
    print(f"ratio ours/naive: wall {ours_t / naive_t:.2f}x, peak RSS {ours_rss / naive_rss:.2f}x")
    ok_rss, ok_time = ours_rss < 1.5 * largest, ours_t <= naive_t
    print(
        f"target RSS < 1.5x largest shard: {'met' if ok_rss else 'MISSED'}; "
        f"target wall <= naive: {'met' if ok_time else 'MISSED'}"
    )
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
