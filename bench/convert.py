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
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"
# VmHWM (peak RSS of this process image); ru_maxrss would carry the parent's over exec.
NAIVE = """
import os, sys, time, torch
from transformers import AutoModelForCausalLM
t = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
m.save_pretrained(sys.argv[2])
if len(sys.argv) > 3:
    os.sync()  # the data on disk, as our conversion guarantees with fsync
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


def run(code: str, src: Path, dst: Path, *extra: str) -> tuple[float, int]:
    """One conversion in a fresh process. Every run starts with no dirty pages and a warm page
    cache for the source, so that none pays for another's write-back."""
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()
    subprocess.run(["cat", *map(str, src.glob("*.safetensors"))], stdout=subprocess.DEVNULL)
    code = code.replace("PEAK", PEAK)
    out = subprocess.run(
        [sys.executable, "-c", code, str(src), str(dst), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    wall, rss = out.stdout.strip().splitlines()[-1].split()
    return float(wall), int(rss)


METHODS = {
    "naive from_pretrained+save": (NAIVE, ()),
    "naive + sync (data on disk)": (NAIVE, ("sync",)),
    "astra-serve convert (fsync)": (OURS, ()),
}


def report(runs: dict[str, list[tuple[float, int]]], largest: int) -> None:
    print(f"{'method':<30}{'wall s median':>14}{'runs':>18}{'peak RSS GB':>13}{'RSS/shard':>11}")
    med = {}
    for name, rs in runs.items():
        walls = sorted(w for w, _ in rs)
        med[name] = (statistics.median(walls), max(r for _, r in rs))
        shown = " ".join(f"{w:.1f}" for w in walls)
        print(
            f"{name:<30}{med[name][0]:>14.1f}{shown:>18}{med[name][1] / 1e9:>13.2f}"
            f"{med[name][1] / largest:>11.2f}"
        )
    ours_t, ours_rss = med["astra-serve convert (fsync)"]
    naive_t, naive_rss = med["naive from_pretrained+save"]
    synced_t, _ = med["naive + sync (data on disk)"]
    print(
        f"ratio ours/naive: wall {ours_t / naive_t:.2f}x ({ours_t / synced_t:.2f}x against "
        f"naive + sync), peak RSS {ours_rss / naive_rss:.2f}x"
    )
    print(
        f"target peak RSS < 1.5x largest shard: "
        f"{'met' if ours_rss < 1.5 * largest else 'MISSED'}; wall <= naive: "
        f"{'met' if ours_t <= naive_t else 'MISSED'}; wall <= naive + sync: "
        f"{'met' if ours_t <= synced_t else 'MISSED'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--workdir", type=Path, default=Path("bench/out/convert"))
    ap.add_argument("--rounds", type=int, default=3)
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
    runs: dict[str, list[tuple[float, int]]] = {m: [] for m in METHODS}
    for _ in range(args.rounds):  # interleaved rounds: drift hits every method alike
        for name, (code, extra) in METHODS.items():
            runs[name].append(run(code, src, args.workdir / "out", *extra))
    report(runs, largest)
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
