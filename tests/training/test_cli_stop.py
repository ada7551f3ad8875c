"""``astra-train`` as a process, stopped by a signal: what its exit does after the message.

The runs themselves are stopped in ``test_sft_attacks`` and ``test_rl_attacks``; here a
stand-in command (no model, nothing to load) goes through the same ``_stoppable`` and the same
entry point, ``training.cli.main``. Also what the process sets before anything loads (TRL's
telemetry off).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter: the entry point runs a stand-in app whose one command raises SIGNAL
# (or nothing, "none") inside `_stoppable`; the last atexit handler says whether the objects
# made so far were left out of the interpreter's final garbage collection (gc.freeze).
PROBE = """
import atexit, gc, signal, sys
from pathlib import Path

import typer

from training import cli

stand_in = typer.Typer()


@stand_in.command()
def run(sig: str, out: Path) -> None:
    with cli._stoppable(out):
        if sig != "none":
            signal.raise_signal(signal.Signals[sig])


atexit.register(lambda: print("frozen:", gc.get_freeze_count() > 0, file=sys.stderr))
cli.app = stand_in
cli.main()
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, None], ids=["SIGINT", "SIGTERM", "no-signal"]
)
def test_a_stopped_process_skips_the_final_garbage_collection(
    tmp_path: Path, sig: signal.Signals | None
) -> None:
    """After "stopped by …" the interpreter's exit would walk every object of torch,
    transformers and TRL (1.5 s idle, 37 s on a loaded machine): a stopped process leaves
    them out; one that ends otherwise exits as Python does."""
    name = sig.name if sig else "none"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, name, str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    if sig is None:
        assert out.returncode == 0 and out.stderr == "frozen: False\n", out.stderr
        return
    assert out.returncode == 128 + sig, out.stderr
    stopped = f"stopped by {sig.name}: no checkpoint was saved yet: the same command starts over"
    assert out.stderr == f"{stopped}\nfrozen: True\n"


@pytest.mark.parametrize(("given", "expected"), [(None, "True"), ("0", "False")])
def test_trls_telemetry_is_off_unless_the_user_turns_it_on(
    given: str | None, expected: str
) -> None:
    """TRL's trainers post a usage record to huggingface.co at start-up; `astra-train` turns that
    off before anything reads the setting, and a user's own setting wins."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_TELEMETRY"}
    if given is not None:
        env["HF_HUB_DISABLE_TELEMETRY"] = given
    probe = "import training.cli; from huggingface_hub import constants as c; "
    probe += "print(c.HF_HUB_DISABLE_TELEMETRY)"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected, out.stderr
