"""Benchmark: `astra-eval bfcl` against the official BFCL pipeline on the same replay model.

For each single-turn, multi-turn and memory category (by default all that run offline), a
replay server (a fake model over real HTTP: multi-turn, the ground-truth calls; single-turn,
per entry the gold answer or one of its mutations, so that scores are not all 100; memory,
each prerequisite conversation's user messages stored in the memory backend and each question
answered with its gold answer after a memory search) serves the model name of a
function-calling registry entry of the official package that talks to any OpenAI-compatible
chat endpoint. It keeps no request bodies.
Then, in the same run:
  * ours: `astra-eval bfcl --concurrency 16` in its own process (inference through
    `run_episode`, then scoring);
  * official: `bfcl generate --num-threads 16` then `bfcl evaluate` (which has no thread
    option), from a separate virtualenv holding `bfcl-eval==2026.3.23` with all its pins.
Target: identical scores, ours at least 8x faster (issue #18; it was 5x).

    .venv/bin/python bench/bfcl_harness.py [--categories base,...] [--limit N]

``--limit N`` runs the first N entries of each category on both sides (the official side
through its id file, ``--run-ids``, scored with ``--partial-eval``): a quick check, not the
figure. Every path reaches the official CLI absolute: it resolves relative ones under
``BFCL_PROJECT_ROOT`` (which would nest the results in a copy of the path).

Our packages are byte-compiled first, as pip compiles an installed package (the official
one is): with ``PYTHONDONTWRITEBYTECODE`` set, as on these machines, every run would
otherwise compile the modules edited since their last ``.pyc`` was written.

The official virtualenv is `make setup`'s .venv-bfcl (scripts/setup-bfcl.sh: torch 2.13.0
first, so that its sentence-transformers dependency does not pull a CUDA build).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from eval.bfcl.categories import MEMORY, MULTI_TURN, SINGLE_TURN, official_name
from eval.bfcl.memory import prerequisites
from eval.bfcl.official import OFFICIAL_FC_MODEL
from eval.bfcl.runner import BFCLSummary, category_entries
from eval.results import SUMMARY


@contextlib.contextmanager
def replay_server(category: str) -> Iterator[str]:
    """The replay model in its own process, as a real endpoint would be, for both harnesses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eval.bfcl.replay",
            "--category",
            category,
            "--port",
            str(port),
            "--model",
            OFFICIAL_FC_MODEL,
            *(["--mixed"] if category in SINGLE_TURN else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and "replay server" in proc.stdout.readline()
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def official_venv(path: Path) -> Path:
    bfcl = path / "bin" / "bfcl"
    if not bfcl.exists():
        subprocess.run(["bash", "scripts/setup-bfcl.sh", str(path)], check=True)
    return bfcl


def run_official(
    bfcl: Path, category: str, base_url: str, work: Path, threads: int, limit: int | None
) -> tuple:
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "replay",
        "BFCL_PROJECT_ROOT": str(work),
    }
    cat = official_name(category)
    select = ["--test-category", cat]
    if limit:  # the official way to run some entries only: its id file
        entries = category_entries(category)[:limit]
        ids = [e.id for e in entries]
        if category in MEMORY:  # a question needs its scenario's prerequisite conversations
            scenarios = dict.fromkeys(getattr(e, "scenario", "") for e in entries)
            ids = [c.id for s in scenarios for c in prerequisites(category, s)] + ids
        (work / "test_case_ids_to_generate.json").write_text(json.dumps({cat: ids}))
        select = ["--run-ids"]
    t0 = time.perf_counter()
    subprocess.run(
        [
            str(bfcl),
            "generate",
            "--model",
            OFFICIAL_FC_MODEL,
            *select,
            "--num-threads",
            str(threads),
            "--result-dir",
            str(work / "result"),
            "-o",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    t1 = time.perf_counter()
    subprocess.run(
        [
            str(bfcl),
            "evaluate",
            "--model",
            OFFICIAL_FC_MODEL,
            "--test-category",
            cat,
            "--result-dir",
            str(work / "result"),
            "--score-dir",
            str(work / "score"),
            *(["--partial-eval"] if limit else []),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    t2 = time.perf_counter()
    score = next((work / "score").rglob(f"BFCL_v4_{cat}_score.json"))
    head = json.loads(score.read_text().splitlines()[0])
    return 100 * head["accuracy"], t1 - t0, t2 - t1


def run_ours(
    category: str, base_url: str, work: Path, concurrency: int, limit: int | None
) -> tuple[float, float]:
    """`astra-eval bfcl` as a user runs it: its own process, timed from start to exit."""
    cli = Path(sys.executable).parent / "astra-eval"
    t0 = time.perf_counter()
    subprocess.run(
        [
            str(cli),
            "bfcl",
            "--base-url",
            base_url,
            "--model",
            OFFICIAL_FC_MODEL,
            "--categories",
            category,
            "--concurrency",
            str(concurrency),
            "--out",
            str(work),
            *(["--limit", str(limit)] if limit else []),
        ],
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    summary = BFCLSummary.model_validate_json((work / SUMMARY).read_text())
    return summary.accuracy[category], wall


def byte_compile() -> None:
    """Our packages' bytecode written, as pip writes an installed package's."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "astra_agent", "eval"],
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--categories", default=",".join(SINGLE_TURN + MULTI_TURN + MEMORY))
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--workdir", type=Path, default=Path("bench/out/bfcl"))
    ap.add_argument("--official-venv", type=Path, default=Path(".venv-bfcl"))
    ap.add_argument("--limit", type=int, default=None, help="first N entries per category")
    args = ap.parse_args()
    workdir = args.workdir.resolve()  # the official CLI resolves relative paths elsewhere
    bfcl = official_venv(args.official_venv.resolve())
    byte_compile()
    shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for category in args.categories.split(","):
        entries = list(category_entries(category))[: args.limit]
        with replay_server(category) as base_url:
            ours = run_ours(
                category, base_url, workdir / "ours" / category, args.threads, args.limit
            )
            official = run_official(
                bfcl, category, base_url, workdir / "official", args.threads, args.limit
            )
        rows.append((category, len(entries), *ours, *official))
    print(
        f"{'category':<24}{'entries':>8}{'ours acc':>10}{'ours s':>9}{'official acc':>14}"
        f"{'generate s':>12}{'evaluate s':>12}{'speed-up':>10}"
    )
    tot_ours = tot_off = 0.0
    for cat, n, acc, wall, oacc, gen, ev in rows:
        tot_ours += wall
        tot_off += gen + ev
        print(
            f"{cat:<24}{n:>8}{acc:>10.1f}{wall:>9.1f}{oacc:>14.1f}{gen:>12.1f}{ev:>12.1f}"
            f"{(gen + ev) / wall:>9.1f}x"
        )
    # ours is recorded to 2 decimals (summary.json), the official score unrounded
    same = all(abs(r[2] - round(r[4], 2)) < 1e-9 for r in rows)
    print(
        f"total: ours {tot_ours:.1f} s, official {tot_off:.1f} s, {tot_off / tot_ours:.1f}x; "
        f"scores identical: {same}; target >= 8x: {'met' if tot_off / tot_ours >= 8 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
