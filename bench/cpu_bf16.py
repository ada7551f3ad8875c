"""Benchmark: does this CPU compute bf16? A bf16 linear against the float32 one (the baseline),
measured in one run, each in a child process uncapped and with oneDNN capped to AVX2 (how
docs/testing.md emulates an AVX2-only machine), plus what ``serving.cpu`` concludes there.

The shape is SmolLM2-135M's MLP up-projection on a batch of 256 tokens (256×576 by 576×1,536).

    .venv/bin/python bench/cpu_bf16.py [--caps none,AVX2,AVX512_CORE] [--iters 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, time, torch
from serving.cpu import bf16_missing
torch.manual_seed(0)
out = {"missing": bf16_missing(), "capability": torch.backends.cpu.get_cpu_capability()}
for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    a, w = torch.randn(256, 576, dtype=dt), torch.randn(1536, 576, dtype=dt)
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    t0 = time.perf_counter()
    for _ in range(ITERS):
        torch.nn.functional.linear(a, w)
    out[name] = 2 * 256 * 576 * 1536 * ITERS / (time.perf_counter() - t0) / 1e9
print(json.dumps(out))
"""


def measure(cap: str, iters: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if cap != "none":
        env["ONEDNN_MAX_CPU_ISA"] = cap
    out = subprocess.run(
        [sys.executable, "-c", CHILD.replace("ITERS", str(iters))],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", default="none,AVX2", help="ONEDNN_MAX_CPU_ISA values; none: uncapped")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    from serving.cpu import describe

    print(f"cpu: {describe()}")
    head = f"{'oneDNN cap':<14}{'float32 GFLOP/s':>17}{'bf16 GFLOP/s':>14}{'bf16/fp32':>11}"
    print(f"{head}  serving.cpu")
    for cap in args.caps.split(","):
        r = measure(cap, args.iters)
        f32, b16 = float(r["float32"]), float(r["bfloat16"])  # type: ignore[arg-type]
        verdict = "bf16 computed" if r["missing"] is None else "no bf16: auto picks float32"
        print(f"{cap:<14}{f32:>17.1f}{b16:>14.1f}{b16 / f32:>10.2f}x  {verdict}")


if __name__ == "__main__":
    main()
