"""Benchmark: SFT and the RL update through our trainers against a plain torch loop.

SmolLM2-135M-Instruct (imported from the GGUF file `make setup` unpacks, float32 master
weights) on the first ``steps × batch`` of the 24 training arena trajectories in task order
(reference chains replayed through the real loop, tokenized with its tokenizer), trained in
one process on the same sequences, dtype and threads:

- **plain**: a plain torch loop over the micro-batches the SFT trainer collates (recorded by an
  untimed warm-up run of it, which also fills oneDNN's kernel cache): ``model(**batch,
  labels=…)`` (transformers' own loss over the full logits, summed over the step's trained
  tokens), backward, gradient clipping at 1, ``torch.optim.AdamW(fused=True)`` (the Trainer's
  default AdamW, and the faster one on these CPUs);
- **sft**: ``training.sft.trl`` as ``astra-train sft`` runs it (TRL's ``SFTTrainer``, our
  ``make_trainer``, ``packing: true``), ``batch`` sequences a step in micro-batches of
  ``micro-batch``;
- **rl**: ``training.rl.trl``'s ``ArenaGRPOTrainer`` as ``astra-train rl`` runs it, without
  rollouts: each step's batch is a fixed group of the same sequences (prompt = up to the first
  assistant token, response = the rest, its assistant tokens trained, fixed advantages), so
  what is timed is the GRPO update (log-probs, the token-mean loss, backward, AdamW).

These machines are shared and their speed swings several-fold within a minute, so the modes
take turns a micro-batch at a time (each in its own thread, one running at a time: a token
ring), and each mode's clock runs only in its own turns; a trainer's turns are bounded by its
callbacks (set-up and clean-up outside, as for the plain loop), and the last micro-batch of a
step carries the optimizer step, logging and the next step's batches. A round is one such
interleaved run from fresh models; the ring's order reverses from one round to the next. The
figure is tokens a second (every token of prompt and response) and tokens per CPU-second of
the process; the ratios trainer/plain are the target (≥ 0.8). The plain loop's and the SFT
warm-up's losses per step are printed side by side: the same micro-batches, so they must
agree within float noise. ``--modes`` picks the modes: ``sft-trl`` and ``rl-trl`` are the
trainers with TRL's own LM head (the code before the head at the trained positions: the
"before" of bench/RESULTS.md). Every mode holds its model and optimizer state (≈ 2.2 GB).

    .venv/bin/python bench/train_speed.py [--steps 2] [--batch 4] [--micro-batch 1]
        [--rounds 2] [--dtype auto|float32|bfloat16] [--threads 2] [--modes plain,sft,rl]
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    arena_rows,
    cpu_model,
    load_average,
    print_load_average,
    quiet_training,
    sft_parser,
    sft_trainer,
)

REPO = Path(__file__).resolve().parents[1]
LR = 5e-5


@dataclass
class Timed:
    """One mode's turns in one round."""

    mode: str
    round: int
    tokens: int
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of the process (all threads) in the mode's turns
    turns: int = 0
    losses: list[float] = field(default_factory=list)  # per optimizer step

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


class Turns:
    """A token ring: the modes' threads run one at a time, in the ring's order, each for one
    turn (a micro-batch). ``start``/``stop`` bound what a turn times (``Timed`` adds up each
    mode's wall and CPU seconds): a trainer's set-up runs in its first turn before the clock
    starts, its clean-up in its last one after the clock stops, so that no untimed work runs
    beside another mode's timed turn. A mode's ``context`` (TRL's head for the "before"
    modes) holds during its turns only."""

    def __init__(self, timed: dict[str, Timed], contexts: dict[str, Callable[[], Any]]) -> None:
        self.ring = list(timed)
        self.timed, self.contexts = timed, contexts
        self.cond = threading.Condition()
        self.stack = contextlib.ExitStack()
        self.since = (0.0, 0.0)

    def acquire(self, mode: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.ring[0] == mode)
        self.stack.enter_context(self.contexts[mode]())

    def start(self) -> None:
        self.since = (time.perf_counter(), time.process_time())

    def stop(self, mode: str) -> None:
        t = self.timed[mode]
        t.wall_s += time.perf_counter() - self.since[0]
        t.cpu_s += time.process_time() - self.since[1]
        t.turns += 1

    def pass_on(self, mode: str, *, done: bool = False) -> None:
        self.stack.close()
        with self.cond:
            self.ring.remove(mode)
            if not done:
                self.ring.append(mode)
            self.cond.notify_all()

    def handoff(self, mode: str) -> None:
        self.stop(mode)
        self.pass_on(mode)
        self.acquire(mode)
        self.start()

    def run(self, runs: dict[str, Callable[[], None]]) -> None:
        """Each mode's ``run`` in its own thread, from its first turn (it passes turns on
        itself) to its last; the first failure is raised here once every thread has ended."""
        errors: list[BaseException] = []

        def take_turns(mode: str, run: Callable[[], None]) -> None:
            self.acquire(mode)
            try:
                run()
            except BaseException as exc:  # the ring goes on, or the others would wait forever
                errors.append(exc)
            finally:
                self.pass_on(mode, done=True)

        threads = [threading.Thread(target=take_turns, args=item) for item in runs.items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]


def turn_callback(turns: Turns, mode: str, losses: list[float]) -> Any:
    """A trainer's turns: one a micro-batch, the first timed from the start of training, the
    last of a step until the next step begins (its optimizer step, logging and the next
    step's batches inside), the last one until training ends; each step's logged loss kept."""
    from transformers import TrainerCallback

    class TakeTurns(TrainerCallback):
        def on_train_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            turns.start()

        def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step > 0:
                turns.handoff(mode)

        def on_substep_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            turns.handoff(mode)

        def on_train_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            turns.stop(mode)

        def on_log(self, a: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    return TakeTurns()


def corpus(workdir: Path, n: int) -> tuple[Path, list[dict[str, Any]]]:
    """SmolLM2 (float32, imported from its GGUF file) and the first ``n`` arena rows."""
    from serving.gguf import SMOLLM2, bundled_gguf, import_gguf

    model = import_gguf(bundled_gguf(SMOLLM2), workdir / "smollm2", dtype="float32", overwrite=True)
    rows = arena_rows(model.dst, workdir, in_task_order=True)
    if len(rows) < n:
        raise SystemExit(f"--steps × --batch = {n} sequences; the corpus has {len(rows)}")
    return model.dst, rows[:n]


class Recording:
    """``TokenCounts`` that also keep the micro-batches the SFT trainer collated, in order."""

    def __init__(self) -> None:
        from training.sft.trl import TokenCounts

        self.counts = TokenCounts()
        self.batches: list[dict[str, Any]] = []

    def add(self, inputs: dict[str, Any]) -> None:
        self.counts.add(inputs)
        self.batches.append({k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.items()})

    def take(self) -> tuple[int, int, int]:
        return self.counts.take()


def sft_settings(args: Any) -> dict[str, Any]:
    return {
        "learning_rate": LR,
        "lr_scheduler": "constant",
        "warmup_ratio": 0.0,
        "packing": True,
        "micro_batch_size": args.micro_batch,
        "global_batch_size": args.batch,
        "trl": {"device": "cpu", "dtype": args.dtype},
    }


def warm_up(model: Path, rows: list[dict[str, Any]], args: Any) -> tuple[list[Any], list[float]]:
    """One untimed SFT run: the micro-batches it collated and its loss per step."""
    from transformers import TrainerCallback

    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, a: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    rec = Recording()
    trainer, _ = sft_trainer(
        model, rows, args.workdir / "warm-up", sft_settings(args), steps=args.steps,
        callbacks=[Losses()], logging_steps=1, counts=rec,
    )  # fmt: skip
    trainer.train()
    return rec.batches, losses


def sft_run(model: Path, rows: list[dict[str, Any]], args: Any, turns: Turns, t: Timed) -> Any:
    trainer, _ = sft_trainer(
        model, rows, args.workdir / t.mode, sft_settings(args), steps=args.steps,
        callbacks=[turn_callback(turns, t.mode, t.losses)], logging_steps=1,
    )  # fmt: skip
    return trainer.train


def plain_run(model_dir: Path, batches: list[Any], args: Any, turns: Turns, t: Timed) -> Any:
    """The plain loop over the SFT trainer's micro-batches (see the module's docstring)."""
    import torch

    from training.device import trains_in_bf16
    from training.sft.config import SFTConfig
    from training.sft.trl import load_model

    cfg = SFTConfig.model_validate(
        {"model": model_dir, "train_files": [args.workdir / "unused.parquet"],
         "output_dir": args.workdir / "plain", **sft_settings(args)}
    )  # fmt: skip
    model = load_model(cfg)  # the trainer's loader: the same attention (per-sequence sdpa)
    model.train()
    per_step = args.batch // args.micro_batch
    bf16 = trains_in_bf16(args.dtype, "cpu")
    # fused: the Trainer's default AdamW on torch ≥ 2.8, and the faster one on these CPUs
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)

    def run() -> None:
        turns.start()
        for s in range(0, len(batches), per_step):
            step = batches[s : s + per_step]
            n = sum(int((b["labels"][:, 1:] != -100).sum()) for b in step)
            total = 0.0
            for i, b in enumerate(step):
                if s or i:
                    turns.handoff(t.mode)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(**b, num_items_in_batch=n).loss
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            t.losses.append(total)
        turns.stop(t.mode)

    return run


class FixedBatches:
    """The RL collector's stand-in: step k's batch is the k-th group of fixed episodes."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    async def collect(self, generator: Any, step: int) -> Any:
        return self.batches[(step - 1) % len(self.batches)]


class NoInference:
    """No rollouts: nothing to sync the weights to."""

    generator = None

    async def sync(self, model: Any, step: int) -> None:
        return None


def rl_batches(rows: list[dict[str, Any]], group: int) -> list[Any]:
    """The rows as RL episodes, ``group`` a step: the prompt up to the first trained token,
    the response after it (its assistant tokens trained, the rest template and tool output),
    fixed advantages (the group's normalised rewards 0, 1/3, 2/3, 1, …)."""
    from astra_agent.arena import load_arena_file
    from astra_agent.trajectory import TokenRecord, Trajectory
    from training.replay import TRAIN_TASKS
    from training.rl.batch import StepBatch
    from training.rl.core import group_advantages
    from training.rl.rollout import Episode, GroupResult

    task = load_arena_file(TRAIN_TASKS).tasks[0]
    out = []
    for k in range(0, len(rows), group):
        episodes = []
        for r in rows[k : k + group]:
            first = r["assistant_masks"].index(1)
            tokens = TokenRecord(
                prompt_ids=r["input_ids"][:first],
                response_ids=r["input_ids"][first:],
                response_mask=r["assistant_masks"][first:],
                logprobs=[0.0] * (len(r["input_ids"]) - first),
            )
            episodes.append(Episode(task.task_id, Trajectory(tokens=tokens), None))
        scores = [(i % 4) / 3 for i in range(len(episodes))]
        adv = group_advantages(scores, [0] * len(episodes))
        out.append(StepBatch(k // group + 1, [GroupResult(task, episodes)], adv))
    return out


def rl_run(model_dir: Path, rows: list[dict[str, Any]], args: Any, turns: Turns, t: Timed) -> Any:
    from astra_agent.arena import load_arena_file
    from training.replay import TRAIN_TASKS
    from training.rl.config import RLConfig
    from training.rl.trl import _load_model, build_trainer
    from training.template import load_tokenizer

    cfg = RLConfig.model_validate(
        {"model": model_dir, "train_files": [TRAIN_TASKS], "output_dir": args.workdir / t.mode,
         "steps": args.steps, "group_size": args.batch, "batch_groups": 1,
         "micro_batch_size": args.micro_batch, "learning_rate": LR, "lr_scheduler": "constant",
         "warmup_steps": 0, "save_steps": 10**6, "rollout": {"engine": "hf"},
         "trl": {"device": "cpu", "dtype": args.dtype}, "convert": {"enabled": False}}
    )  # fmt: skip
    runner = asyncio.Runner()
    trainer = build_trainer(
        cfg, _load_model(cfg), load_tokenizer(model_dir), load_arena_file(TRAIN_TASKS).tasks,
        FixedBatches(rl_batches(rows, args.batch)), NoInference(), runner,
    )  # fmt: skip
    trainer.args.save_strategy = "no"  # the update is timed, not the final checkpoint
    trainer.add_callback(turn_callback(turns, t.mode, t.losses))

    def run() -> None:
        try:
            trainer.train()
        finally:
            runner.close()

    return run


@contextlib.contextmanager
def trl_head() -> Iterator[None]:
    """TRL's fused LM head in both trainers (the code before the head at trained positions)."""
    import training.rl.trl as rl
    import training.sft.trl as sft

    kept = sft.head_at_trained_positions, rl.head_at_trained_positions
    sft.head_at_trained_positions = lambda *a: False
    rl.head_at_trained_positions = lambda *a: False
    try:
        yield
    finally:
        sft.head_at_trained_positions, rl.head_at_trained_positions = kept


def one_round(
    n: int, modes: list[str], model: Path, rows: list[Any], batches: list[Any], args: Any
) -> list[Timed]:
    """Fresh models and trainers for ``modes`` (built one after the other, untimed), then
    their micro-batches in turns."""
    tokens = sum(len(r["input_ids"]) for r in rows)
    timed = {m: Timed(m, n, tokens) for m in modes}
    contexts = {m: trl_head if m.endswith("-trl") else contextlib.nullcontext for m in modes}
    turns = Turns(timed, contexts)
    runs = {}
    for m in modes:
        t = timed[m]
        if m == "plain":
            runs[m] = plain_run(model, batches, args, turns, t)
        elif m.startswith("sft"):
            runs[m] = sft_run(model, rows, args, turns, t)
        else:
            runs[m] = rl_run(model, rows, args, turns, t)
    load0 = load_average()
    turns.run(runs)
    print(f"round {n} ({' → '.join(modes)}; load {load0:.2f} → {load_average():.2f})")
    for t in timed.values():
        print(
            f"  {t.mode:<8} {t.wall_s:>7.1f} s {t.cpu_s:>7.1f} CPU-s {t.turns:>3} turns "
            f"{t.tokens_per_s:>7.1f} tokens/s {t.tokens / t.cpu_s:>7.1f} per CPU-s",
            flush=True,
        )
    return list(timed.values())


def rate(ts: list[Timed], cpu: bool = False) -> float:
    return sum(t.tokens for t in ts) / sum(t.cpu_s if cpu else t.wall_s for t in ts)


def report(results: list[Timed], warm_losses: list[float]) -> None:
    modes = ["plain"] + [m for m in dict.fromkeys(t.mode for t in results) if m != "plain"]
    plain = [t for t in results if t.mode == "plain"]
    print(
        f"\n{'mode':<9}{'wall s':>8}{'tokens':>8}{'tokens/s':>10}{'÷ plain':>9}"
        f"{'per CPU-s':>11}{'÷ plain':>9}  per round ÷ plain (tokens/s)"
    )
    for mode in modes:
        ts = [t for t in results if t.mode == mode]
        per = ", ".join(
            f"{t.tokens_per_s / p.tokens_per_s:.2f}" for t, p in zip(ts, plain, strict=True)
        )
        print(
            f"{mode:<9}{sum(t.wall_s for t in ts):>8.1f}{sum(t.tokens for t in ts):>8}"
            f"{rate(ts):>10.1f}{rate(ts) / rate(plain):>8.2f}x"
            f"{rate(ts, cpu=True):>11.1f}{rate(ts, cpu=True) / rate(plain, cpu=True):>8.2f}x  {per}"
        )
    for mode in modes[1:]:
        ratio = rate([t for t in results if t.mode == mode]) / rate(plain)
        print(f"target {mode}/plain ≥ 0.8 (tokens/s): {'met' if ratio >= 0.8 else 'MISSED'}")
    pairs = list(zip(plain[0].losses, warm_losses, strict=True))
    shown = ", ".join(f"{a:.4f}/{b:.4f}" for a, b in pairs)
    print(
        f"loss per step, plain (round 1) / SFT trainer (warm-up): {shown}; "
        f"max |Δ| {max(abs(a - b) for a, b in pairs):.4f}"
    )


def release_memory(need_gb: float) -> None:
    """Free what the last run left (Python's cycles, then glibc's free pages), then wait, up to
    10 minutes, until the machine has ``need_gb`` available: the modes' models and optimizer
    states are held at once, and other jobs on a shared machine come and go."""
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for _ in range(60):
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        if avail / 2**20 >= need_gb:
            return
        print(f"  waiting for {need_gb:.0f} GB of memory ({avail / 2**20:.1f} available)")
        time.sleep(10)


def one_malloc_arena() -> None:
    """Run again with glibc's allocator on one arena: each thread would otherwise keep its own
    arena of freed activations (several GB per mode: the run outgrew 18 GB before this)."""
    if os.environ.get("MALLOC_ARENA_MAX") != "1":
        os.environ["MALLOC_ARENA_MAX"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main() -> None:
    one_malloc_arena()
    ap = sft_parser(__doc__, steps=2, workdir=REPO / "bench" / "out" / "train_speed")
    ap.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument(
        "--modes", default="plain,sft,rl",
        help="of plain, sft, rl, sft-trl, rl-trl (the trainers with TRL's head: the code before)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.batch % args.micro_batch:
        raise SystemExit("--batch must be a multiple of --micro-batch")
    quiet_training(args.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from training.device import trains_in_bf16

    bf16 = trains_in_bf16(args.dtype, "cpu")
    model, rows = corpus(args.workdir, args.steps * args.batch)
    print(
        f"CPU: {cpu_model()}; {args.threads} threads; {'bf16 autocast' if bf16 else 'float32'}"
        f"\n{len(rows)} sequences, {sum(len(r['input_ids']) for r in rows)} tokens "
        f"({sum(sum(r['assistant_masks']) for r in rows)} trained); {args.steps} steps of "
        f"{args.batch} in micro-batches of {args.micro_batch}; load {load_average():.2f}",
        flush=True,
    )
    modes = args.modes.split(",")
    if "plain" not in modes or not set(modes) <= {"plain", "sft", "rl", "sft-trl", "rl-trl"}:
        raise SystemExit("--modes: plain and any of sft, rl, sft-trl, rl-trl")
    batches, warm_losses = warm_up(model, rows, args)
    results: list[Timed] = []
    for n in range(1, args.rounds + 1):
        release_memory(3.5 * len(modes))  # ≈ 2.2 GB of state a mode, activations, headroom
        results += one_round(n, modes if n % 2 else modes[::-1], model, rows, batches, args)
    report(results, warm_losses)
    print_load_average()


if __name__ == "__main__":
    main()
