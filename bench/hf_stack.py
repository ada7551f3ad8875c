"""Benchmark: the transformers server (``astra-serve up --engine hf``) of this tree against the
same server of an older tree, both up at once on the same model, rounds alternating.

Decode speed must not fall with the server's HTTP stack and request checks (issue 38). Two
servers run side by side (SmolLM2-135M-Instruct imported from its GGUF file, the same flags,
one per tree: this tree's ``python -m serving.hf_server`` and the old tree's, run from there);
each round measures one request at a time, then ``--concurrency`` at a time, on the old server
and on the new one, the order reversed every other round, so that a shared machine's load falls
on both alike. Printed: tokens/s of each round, medians, and new ÷ old.

    git worktree add /tmp/old-tree 9a55edc        # the tree before the change
    .venv/bin/python bench/hf_stack.py --old-tree /tmp/old-tree [--rounds 4] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _common import cpu_model, load_average
from decode import free_port, tokens_per_s


def _start(cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"a server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit(f"a server did not answer in {timeout:.0f} s: {log.read_text()[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old-tree", type=Path, required=True, help="a checkout of the older tree")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16", help="the same for both servers")
    args = ap.parse_args()
    old_tree = args.old_tree.resolve()
    if not (old_tree / "serving" / "hf_server.py").is_file():
        sys.exit(f"--old-tree {old_tree}: no serving/hf_server.py there")
    from serving.gguf import SMOLLM2, bundled_gguf, import_gguf

    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        model = import_gguf(bundled_gguf(SMOLLM2), Path(tmp) / "smollm2").dst
        servers: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        try:
            for name, tree in (("old", old_tree), ("new", here)):
                port = free_port()
                cmd = [sys.executable, "-m", "serving.hf_server", "--model", str(model),
                       "--served-model-name", "smollm2-135m", "--port", str(port),
                       "--max-model-len", "2048", "--dtype", args.dtype,
                       "--device", "cpu"]  # fmt: skip
                log = Path(tmp) / f"{name}.log"
                servers[name] = (f"http://127.0.0.1:{port}/v1", _start(cmd, tree, log))
                _wait(servers[name][0], servers[name][1], log)
            for url, _ in servers.values():
                asyncio.run(tokens_per_s(url, 16, 1, 2))  # warm-up
            one: dict[str, list[float]] = {"old": [], "new": []}
            many: dict[str, list[float]] = {"old": [], "new": []}
            n = args.concurrency
            load0 = load_average()
            for r in range(args.rounds):
                for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    url = servers[name][0]
                    one[name].append(asyncio.run(tokens_per_s(url, args.tokens, 1, 3)))
                    many[name].append(asyncio.run(tokens_per_s(url, args.tokens, n, 2 * n)))
                print(
                    f"round {r + 1}: 1 request old {one['old'][-1]:.1f} new {one['new'][-1]:.1f}"
                    f" | {n} at once old {many['old'][-1]:.1f} new {many['new'][-1]:.1f} tokens/s",
                    flush=True,
                )
        finally:
            for _, proc in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    print(f"\n{cpu_model()}; {args.tokens} tokens a request, greedy, {args.dtype}; "
          f"load average {load0} at the start, {load_average()} at the end")  # fmt: skip
    for what, got in (("1 request", one), (f"{n} at once", many)):
        old, new = statistics.median(got["old"]), statistics.median(got["new"])
        per_round = [round(b / a, 2) for a, b in zip(got["old"], got["new"], strict=True)]
        print(
            f"  {what:>10}: old {old:7.1f}  new {new:7.1f} tokens/s (medians)  "
            f"new/old {new / old:.2f}  per round {per_round}"
        )


if __name__ == "__main__":
    main()
