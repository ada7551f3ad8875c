"""Benchmark: SFT of the real model in bf16 autocast against float32, on CPU.

SmolLM2-135M-Instruct (imported from the GGUF file `make setup` unpacks, float32 weights) on the
24 training arena trajectories (reference chains replayed through the real loop, tokenized with
its tokenizer by ``training.template.tokenize``), trained by the same ``SFTTrainer`` twice in
one run: the same rows in the same order, the same seed, steps and micro batch (1 sequence), AdamW
at 5e-5. Only ``trl.dtype`` differs: ``float32`` (the baseline) and ``bfloat16`` (autocast,
float32 master weights). Figures: tokens per second of each, the ratio (target ≥ 6×), and the
per-step losses side by side (target: equal within noise; their largest and mean difference).

    .venv/bin/python bench/sft_bf16.py [--steps 12] [--threads 2]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import arena_rows, print_load_average, quiet_training, sft_parser, train_sft

REPO = Path(__file__).resolve().parents[1]


def corpus(workdir: Path) -> tuple[Path, list[dict[str, Any]]]:
    """SmolLM2 (float32, imported from its GGUF file) and the arena rows in its tokens."""
    from serving.gguf import SMOLLM2, import_gguf

    model = import_gguf(SMOLLM2, workdir / "smollm2-fp32", dtype="float32", overwrite=True).dst
    return model, arena_rows(model, workdir)


def train_once(model_dir: Path, rows: list[dict[str, Any]], out: Path, dtype: str, steps: int):
    from transformers import TrainerCallback

    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    settings = {
        "learning_rate": 5e-5,
        "lr_scheduler": "constant",
        "warmup_ratio": 0.0,
        "packing": True,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "trl": {"device": "cpu", "dtype": dtype},
    }
    trainer, counts, wall = train_sft(
        model_dir, rows, out, settings, steps=steps, callbacks=[Losses()], logging_steps=1
    )
    master = {str(p.dtype) for p in trainer.model.parameters()}
    return {"wall_s": wall, "tokens": counts.tokens, "tokens_per_s": counts.tokens / wall,
            "losses": losses, "master": ",".join(sorted(master))}  # fmt: skip


def report(fp32: dict[str, Any], bf16: dict[str, Any], steps: int) -> None:
    print(f"SmolLM2-135M-Instruct, {steps} steps of 1 sequence, same rows, same seed")
    print(f"{'trl.dtype':<34}{'wall s':>8}{'tokens':>9}{'tokens/s':>10}  master weights")
    for name, r in (("float32 (baseline)", fp32), ("bfloat16 (autocast)", bf16)):
        print(
            f"{name:<34}{r['wall_s']:>8.1f}{r['tokens']:>9}{r['tokens_per_s']:>10.1f}  "
            f"{r['master']}"
        )
    ratio = bf16["tokens_per_s"] / fp32["tokens_per_s"]
    verdict = "met" if ratio >= 6 else "MISSED"
    print(f"ratio bf16/fp32 tokens/s: {ratio:.2f}x (target ≥ 6x: {verdict})")
    print("step  loss fp32  loss bf16   |Δ|")
    diffs = []
    for i, (a, b) in enumerate(zip(fp32["losses"], bf16["losses"], strict=True), 1):
        diffs.append(abs(a - b))
        print(f"{i:>4}  {a:>9.4f}  {b:>9.4f}  {abs(a - b):.4f}")
    print(f"loss |Δ|: max {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}")
    print_load_average()


def main() -> None:
    ap = sft_parser(__doc__, steps=12, workdir=REPO / "bench" / "out" / "sft_bf16")
    args = ap.parse_args()
    quiet_training(args.threads)
    model, rows = corpus(args.workdir)
    print(f"corpus: {len(rows)} rows, {sum(len(r['input_ids']) for r in rows)} tokens")
    fp32 = train_once(model, rows, args.workdir / "fp32", "float32", args.steps)
    bf16 = train_once(model, rows, args.workdir / "bf16", "bfloat16", args.steps)
    report(fp32, bf16, args.steps)


if __name__ == "__main__":
    main()
