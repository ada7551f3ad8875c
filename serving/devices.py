"""Which torch device a user may ask for on this machine, checked before anything is loaded.

``cpu`` and ``auto`` always (``auto``: CUDA if torch sees a GPU, else the CPU); ``cuda`` and
``cuda:N`` only where torch sees CUDA devices (``N`` below their count). A GPU asked for and
absent is refused, never replaced by the CPU. Serving's ``--device`` (the hf engine) and
training's ``trl.device`` share :func:`check_device`.
"""

from __future__ import annotations

import re

from astra_agent.errors import ConfigError

CUDA = re.compile(r"cuda(?::(\d+))?")


def _cuda_devices() -> tuple[int, str | None]:
    """How many CUDA devices torch sees here, and why none where it sees none."""
    import torch

    if torch.version.cuda is None:
        return 0, f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return 0, "torch sees no CUDA device here (torch.cuda.is_available() is false)"
    return torch.cuda.device_count(), None


def check_device(value: str, what: str = "--device") -> str:
    """``value`` as given, if this machine has that device; else a ConfigError that names the
    value and what is accepted here. ``what`` names the setting in the message (``--device``,
    ``trl.device``)."""
    names = ["auto", "cpu"]
    if value in names:
        return value
    cuda = CUDA.fullmatch(value)
    if cuda is None:
        accepted = [*names, "cuda, cuda:N (where torch sees a GPU)"]
        raise _refusal(value, what, "not a device", accepted, hint=f"e.g. {_setting(what, 'cpu')}")
    count, why = _cuda_devices()
    index = int(cuda.group(1) or 0)
    if why is None and index < count:
        return value
    if why is None:
        names += ["cuda", *(f"cuda:{i}" for i in range(count))]
        why = f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    raise _refusal(
        value,
        what,
        f"a GPU asked for, but {why}",
        names,
        hint="a GPU asked for is never replaced by the CPU: run where torch sees that GPU, or "
        f"ask for the CPU ({_setting(what, 'cpu')})",
    )


def _setting(what: str, value: str) -> str:
    """How a user sets ``what`` to ``value``: ``--device cpu``, ``--set trl.device=cpu``."""
    return f"{what} {value}" if what.startswith("-") else f"--set {what}={value}"


def _refusal(value: str, what: str, why: str, accepted: list[str], *, hint: str) -> ConfigError:
    return ConfigError(f"{what} {value!r}: {why}; accepted here: {', '.join(accepted)}", hint=hint)


def resolve_device(value: str, what: str = "--device") -> str:
    """:func:`check_device`, with ``auto`` resolved: ``cuda`` where torch sees a GPU, else
    ``cpu``."""
    if check_device(value, what) != "auto":
        return value
    return "cuda" if _cuda_devices()[0] > 0 else "cpu"
