"""What this machine's CPU computes: whether bfloat16 runs in hardware here, and a one-line
description of the CPU for logs and test reports.

bfloat16 pays on a CPU only where the cores compute it (AVX512-BF16 or AMX on x86, the BF16
extension on ARM): elsewhere torch emulates it and a bf16 matmul runs several times slower than
a float32 one (``bench/cpu_bf16.py``; figures in bench/RESULTS.md).
Training's ``trl.dtype: auto`` and serving's ``dtype: auto`` both ask :func:`bf16_missing`.

The flags in /proc/cpuinfo are not the whole answer: ``ONEDNN_MAX_CPU_ISA`` caps the
instruction sets of oneDNN, which runs torch's bf16 CPU matmuls. A process started with it
below AVX512_CORE_BF16 computes bf16 matmuls no faster than a CPU without bf16 (on the AMX
Xeon, ``bench/cpu_bf16.py``: 34-36 GFLOP/s at AVX2, 75 at AVX512_CORE, 820-2,000 uncapped).
``ATEN_CPU_CAPABILITY`` caps only torch's own element-wise kernels, and
``MKL_ENABLE_INSTRUCTIONS`` MKL's float32 matmuls; neither touches bf16. All three together make
a faster machine behave as an AVX2-only one (docs/testing.md).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# x86: AVX512-BF16 and AMX's bf16 tiles; ARM (aarch64): the BF16 extension
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# oneDNN's ISAs below AVX512_CORE_BF16 (its documented names for ONEDNN_MAX_CPU_ISA)
ONEDNN_NO_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


def _cpuinfo_fields(cpuinfo: Path | None = None) -> dict[str, str]:
    """The fields of the first CPU listed in ``cpuinfo``; empty where it cannot be read."""
    try:
        text = (cpuinfo or CPUINFO).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def _flags_of(fields: dict[str, str]) -> frozenset[str]:
    return frozenset((fields.get("flags") or fields.get("Features") or "").split())


def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str]:
    """The feature flags of the first CPU listed in ``cpuinfo`` (x86's ``flags``, ARM's
    ``Features``); empty where the file cannot be read (not Linux, a sandbox)."""
    return _flags_of(_cpuinfo_fields(cpuinfo))


def isa_cap() -> str | None:
    """Why this process may not use the CPU's bf16 instructions although the CPU has them
    (oneDNN capped below them in its environment), or None."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if onednn in ONEDNN_NO_BF16:
        return f"ONEDNN_MAX_CPU_ISA={onednn} caps oneDNN's matmuls below bfloat16"
    return None


def bf16_missing(flags: frozenset[str] | None = None) -> str | None:
    """Why this process's CPU (with ``flags``, read from /proc/cpuinfo unless given) does not
    compute bfloat16 (it would be emulated, slower than float32), or None where it does."""
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return f"the CPU's flags cannot be read from {CPUINFO}"
    if not flags & CPU_BF16_FLAGS:
        return (
            "this CPU has none of the bfloat16 flags avx512_bf16, amx_bf16 (x86) or bf16 (ARM) "
            f"in {CPUINFO}: bfloat16 would be emulated, slower than float32"
        )
    return isa_cap()


def describe() -> str:
    """One line: the CPU's model, its bf16/AMX/AVX flags, and whether this process computes
    bf16 (with the reason where not). For test reports and logs."""
    fields = _cpuinfo_fields()
    model = fields.get("model name") or fields.get("CPU part") or platform.processor() or "?"
    flags = _flags_of(fields)
    shown = sorted(f for f in flags if f in CPU_BF16_FLAGS or f.startswith(("amx", "avx")))
    why = bf16_missing(flags)
    bf16 = "bf16 computed" if why is None else f"no bf16 ({why})"
    return f"{model}, {os.cpu_count()} cores; {' '.join(shown) or 'no avx/amx flags'}; {bf16}"
