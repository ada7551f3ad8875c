"""Benchmark: our padding-free SFT batches against TRL's default padded batches.

The tiny model (random weights, the scripted checkpoint's tokenizer) on the 24 training arena
trajectories (reference chains replayed through the real loop, tokenized by
``training.template.tokenize``), trained by the same ``SFTTrainer`` twice in one run: the same
rows in the same order (same seed), the same steps and micro batch; only the collation differs.
``ours`` concatenates each micro batch into one row (positions restart per sequence, no pad
token computed: ``packing: true``); the baseline pads each micro batch to its longest row
(TRL's default collator). Figures: trained tokens per second (assistant tokens, the ones with a
loss) and the share of processed tokens that are padding. Targets: padding < 5 % and ≥ 1.5× the
baseline's trained tokens/s.

    .venv/bin/python bench/sft.py [--steps 24] [--micro-batch 8] [--threads 2]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import arena_rows, print_load_average, quiet_training, sft_parser, train_sft

REPO = Path(__file__).resolve().parents[1]


def corpus(workdir: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The random tiny checkpoint and the arena rows as ``{"input_ids", "assistant_masks"}``."""
    from serving.tiny import TinySpec, build_tiny_checkpoint

    model = build_tiny_checkpoint(
        workdir / "tiny-random", TinySpec(behavior="random"), overwrite=True
    )
    return model, arena_rows(model, workdir)


def train_once(
    model_dir: Path, rows: list[dict[str, Any]], out: Path, *, packed: bool, steps: int, micro: int
) -> dict[str, float]:
    settings = {
        "learning_rate": 3e-3,
        "packing": packed,
        "micro_batch_size": micro,
        "global_batch_size": micro,
    }
    _, counts, wall = train_sft(model_dir, rows, out, settings, steps=steps)
    return {
        "wall_s": wall,
        "tokens": counts.tokens,
        "padding": counts.padding,
        "trained": counts.trained,
        "trained_per_s": counts.trained / wall,
        "tokens_per_s": counts.tokens / wall,
        "padding_share": counts.padding / counts.tokens,
    }


def report(ours: dict[str, float], base: dict[str, float], steps: int, micro: int) -> None:
    print(f"{steps} steps, micro batch {micro}, same rows in the same order")
    print(
        f"{'collation':<34}{'wall s':>8}{'tokens':>9}{'padding':>9}{'trained':>9}"
        f"{'trained tok/s':>15}{'pad share':>11}"
    )
    for name, r in (("TRL default (padded)", base), ("ours (padding-free, packed)", ours)):
        print(
            f"{name:<34}{r['wall_s']:>8.1f}{r['tokens']:>9.0f}{r['padding']:>9.0f}"
            f"{r['trained']:>9.0f}{r['trained_per_s']:>15.1f}{r['padding_share']:>10.1%}"
        )
    ratio = ours["trained_per_s"] / base["trained_per_s"]
    print(f"ratio ours/padded trained tokens/s: {ratio:.2f}x")
    print(
        f"target padding < 5 %: {'met' if ours['padding_share'] < 0.05 else 'MISSED'}; "
        f"≥ 1.5x trained tokens/s: {'met' if ratio >= 1.5 else 'MISSED'}"
    )
    print_load_average()


def main() -> None:
    ap = sft_parser(__doc__, steps=24, workdir=REPO / "bench" / "out" / "sft")
    ap.add_argument("--micro-batch", type=int, default=8)
    args = ap.parse_args()
    quiet_training(args.threads)
    model, rows = corpus(args.workdir)
    n = sum(len(r["input_ids"]) for r in rows)
    print(
        f"corpus: {len(rows)} rows, {n} tokens, "
        f"{sum(sum(r['assistant_masks']) for r in rows)} trained"
    )
    kw = {"steps": args.steps, "micro": args.micro_batch}
    base = train_once(model, rows, args.workdir / "padded", packed=False, **kw)
    ours = train_once(model, rows, args.workdir / "packed", packed=True, **kw)
    report(ours, base, **kw)


if __name__ == "__main__":
    main()
