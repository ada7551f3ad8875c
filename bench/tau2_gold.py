"""τ²'s gold replay, full: every retail and telecom task through `astra-eval tau2` (the CLI, a
process of its own) against the gold replay model served from a process of its own (a fake
model over real HTTP). Every task whose checks the gold moves satisfy must score 1.0; the rest
are listed with the scorer's reason.

Then the cost of a conversation, ours against a baseline measured in the same run: the same
retail tasks run as inspect_ai runs them by default (``--set inspect_log=true``: its transcript
with the whole store, retail's 2.6 MB database included, diffed at every step, and its sample
log written).

    .venv/bin/python bench/tau2_gold.py [--domains retail,telecom] [--limit N] [--sample 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def serve(port: int, domains: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [PY, "-m", "eval.tau2.replay", "--port", str(port), "--domains", domains],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the gold replay server did not start") from None
            time.sleep(0.3)


def run(args: list[str]) -> tuple[float, float]:
    """Wall seconds and the CLI process's CPU seconds (user + system, its children too)."""
    t0, c0 = time.monotonic(), os.times()
    r = subprocess.run(
        [PY, "-m", "eval", "tau2", *args], cwd=ROOT,
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"astra-eval tau2 failed ({r.returncode}):\n{r.stderr[-3000:]}")
    c1 = os.times()
    cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    return time.monotonic() - t0, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", default="retail,telecom")
    ap.add_argument("--limit", type=int, default=None, help="first N tasks of each domain")
    ap.add_argument("--sample", type=int, default=20, help="retail tasks for the cost ratio")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--port", type=int, default=18431)
    a = ap.parse_args()
    server = serve(a.port, a.domains)
    base = ["--base-url", f"http://127.0.0.1:{a.port}/v1", "--trials", "1",
            "--concurrency", str(a.concurrency)]  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "full"
            limit = ["--limit", str(a.limit)] if a.limit else []
            wall, cpu = run([*base, "--domains", a.domains, *limit, "--out", str(out)])
            records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
            summary = json.loads((out / "summary.json").read_text())
            failed = [r for r in records if r["reward"] != 1.0]
            print(f"gold replay: {len(records)} conversations in {wall:.0f} s "
                  f"({cpu / len(records):.2f} CPU s each, imports included)")  # fmt: skip
            for name, row in summary["domains"].items():
                print(f"  {name}: {row['tasks']} tasks, pass^1 {row['pass_hat_k'].get('1')}")
            for r in failed:
                why = r["error"] or r["explanation"].replace("\n", " | ")
                print(f"  not 1.0: {r['id']}: {why[:300]}")
            sample = ["--domains", "retail", "--limit", str(a.sample)]
            ours = run([*base, *sample, "--out", str(Path(tmp) / "ours")])
            tracked = run([*base, *sample, "--set", "inspect_log=true",
                           "--out", str(Path(tmp) / "tracked")])  # fmt: skip
            ratio = tracked[1] / ours[1]
            print(f"{a.sample} retail conversations, CPU s (wall s): ours {ours[1]:.1f} "
                  f"({ours[0]:.1f}), inspect_ai's default {tracked[1]:.1f} ({tracked[0]:.1f}); "
                  f"ratio default/ours {ratio:.2f}×")  # fmt: skip
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
