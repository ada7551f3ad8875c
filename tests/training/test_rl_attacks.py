"""``astra-train rl`` under bad input and failures (issue 13, "Bad input").

Every case goes through the CLI (``python -m training.cli rl --config FILE``: in-process with
typer's runner, or as a process where it must be killed) with the smallest real run: the
scripted tiny checkpoint samples itself (``rollout.engine: hf``), one group of two rollouts of
at most two turns per step. Its behaviour is fixed (it calls ``get_current_time`` with
``{"timezone": "UTC"}`` and then answers), so the records below give it tools of that name
that answer, hang, crash, return a megabyte, or cannot be loaded at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from astra_agent.arena import parse_record
from astra_agent.sandbox import SandboxLimits, bwrap_available
from serving.hf_generator import HFGenerator
from tests.conftest import kill_after_records
from tests.training.conftest import train_in_process
from tests.training.e2e import write_recipe
from training.metrics import MetricsLog
from training.rl.batch import load_tasks
from training.rl.config import RLConfig
from training.rl.pool import SandboxPool
from training.rl.rollout import rollout_episode, rollout_group, settings_of
from training.run import last_complete_checkpoint
from training.template import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap"),
    pytest.mark.usefixtures("torch_threads_kept"),
]

TOOL = "get_current_time"
OK = f"def {TOOL}(timezone):\n    return '12:00 ' + timezone\n"
HANG = f"def {TOOL}(timezone):\n    while True:\n        pass\n"
CRASH = f"import os\n\n\ndef {TOOL}(timezone):\n    os._exit(1)\n"
HUGE = f"def {TOOL}(timezone):\n    return '12:00 ' + 'x' * (1 << 20)\n"
NEVER = f"def {TOOL}(timezone):\n    return 'no idea'\n"  # the gold answer is never seen
# its sandbox takes 2 s to load it: a stop early in a rollout lands while sandboxes start
SLOW = f"import time\n\ntime.sleep(2)\n\n\ndef {TOOL}(timezone):\n    return '12:00 ' + timezone\n"


def record(task_id: str, source: str = OK, prompt: str = "What time is it in UTC?") -> dict:
    """An arena record (the ASTRA-RL format of eval/arenas/data/train.jsonl) with one tool."""
    schema = {
        "type": "function",
        "function": {
            "name": TOOL,
            "description": "The current time in a timezone.",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"],
            },
        },
    }
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "tool_schema": json.dumps([schema]),
        "tool_dict": json.dumps({TOOL: source}),
        "sub_qa_dict": json.dumps({TOOL: ["12:00"]}),
        "task_id": task_id,
        "domain": "attacks",
    }


def write_jsonl(path: Path, lines: list[dict | str]) -> Path:
    text = "".join((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n"
                   for x in lines)  # fmt: skip
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("records")
    missing_field = record("missing-field")
    del missing_field["sub_qa_dict"]
    broken = record("no-compile", f"def {TOOL}(timezone):\n    return (\n")
    return {
        "ok": write_jsonl(d / "ok.jsonl", [record("ok")]),
        "mixed": write_jsonl(
            d / "mixed.jsonl",
            [record("ok"), '{"prompt": [oops', missing_field, broken, record("ok-2")],
        ),
        "all_bad": write_jsonl(d / "all-bad.jsonl", [missing_field, broken, "[1, 2]"]),
        "hang_crash": write_jsonl(
            d / "hang-crash.jsonl", [record("hang", HANG), record("crash", CRASH)]
        ),
        "unicode": write_jsonl(
            d / "unicode.jsonl",
            [
                record("emoji", prompt="What time is it? \U0001f600\U0001f30d é中"),
                # U+2028/U+2029/U+0085 written raw: JSON allows them inside a string
                record("separators", prompt="line\u2028sep\u2029para\x85next"),
                # a lone surrogate: valid JSON (escaped), not valid Unicode text
                json.dumps(record("surrogate", prompt="broken \ud800 half")),
            ],
        ),
        "huge": write_jsonl(d / "huge.jsonl", [record("huge", HUGE)]),
        "never": write_jsonl(d / "never.jsonl", [record("never", NEVER)]),
        # two tasks, one group a step: 2 steps an epoch
        "two": write_jsonl(d / "two.jsonl", [record("ok"), record("ok-2")]),
        "slow": write_jsonl(d / "slow.jsonl", [record("slow", SLOW)]),
    }


def recipe(tmp_path: Path, model: Path, train: Path | list[Path], **over: Any) -> Path:
    """The smallest real run: 1 step of one group of 2 rollouts, ≤2 turns of ≤32 tokens."""
    cfg: dict[str, Any] = {
        "model": str(model),
        "train_files": [str(p) for p in (train if isinstance(train, list) else [train])],
        "output_dir": str(tmp_path / "run"),
        "steps": 1,
        "group_size": 2,
        "batch_groups": 1,
        "micro_batch_size": 1,
        "save_steps": 1,
        "save_total_limit": 10,
        "rollout": {"engine": "hf", "max_tokens_per_turn": 32, "max_turns": 2, "concurrency": 2},
        "trl": {"device": "cpu", "threads": 1},
        "convert": {"enabled": False},
        "abf": {"enabled": False},
    }
    return write_recipe(tmp_path, cfg, over)


def rl(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``astra-train rl ARGS`` in-process: (exit code, stdout + stderr, whitespace folded)."""
    code, out = train_in_process("rl", *args, env=env)
    return code, " ".join(out.split())


def refused_before_anything(tmp_path: Path, patch: dict, env: dict | None, named: str) -> None:
    """The recipe with ``patch`` (and ``env``) is refused, one message naming ``named``, and
    nothing is written."""
    cfg = recipe(tmp_path, tmp_path / "no-model", tmp_path / "no.jsonl", **patch)
    code, out = rl("--config", str(cfg), env=env)
    assert code == 2 and named in out and "Traceback" not in out, out
    assert not (tmp_path / "run").exists()


def metrics(run: Path) -> list[dict[str, Any]]:
    return MetricsLog.read(run / "metrics.jsonl")


# ------------------------------------------------------------------- refused before anything


@pytest.mark.parametrize(
    ("patch", "env", "named"),
    [
        ({"learnig_rate": 1e-3}, None, "learnig_rate"),
        ({"abf": {"deltta": 0.1}}, None, "abf.deltta"),
        ({"rollout": {"temprature": 0.5}}, None, "rollout.temprature"),
        ({"sandbox": {"wall_seconds": 1}}, None, "sandbox.wall_seconds"),
        ({"rollout": {"serve": {"dtyp": "float32"}}}, None, "'dtyp'"),
        ({"rollout": {"serve": {"model": "x"}}}, None, "model cannot be set here"),
        ({}, {"ASTRA_TRAIN_ABF__DELTTA": "0.1"}, "$ASTRA_TRAIN_ABF__DELTTA"),
    ],
    ids=["top-level", "abf", "rollout", "sandbox", "serve", "serve-model", "environment"],
)
def test_an_unknown_key_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, wide_consoles: None, patch: dict, env: dict | None, named: str
) -> None:
    refused_before_anything(tmp_path, patch, env, named)


@pytest.mark.parametrize(
    ("patch", "env", "named"),
    [
        ({"learning_rate": "nan"}, None, "learning_rate: Input should be a finite number"),
        ({}, {"ASTRA_TRAIN_LEARNING_RATE": "inf"}, "learning_rate: Input should be a finite"),
        ({"learning_rate": -1e-6}, None, "learning_rate: Input should be greater than 0"),
        ({"max_grad_norm": "Infinity"}, None, "max_grad_norm: Input should be a finite"),
        ({"clip_high": "inf"}, None, "clip_high: Input should be a finite number"),
        ({"advantage_eps": "inf"}, None, "advantage_eps: Input should be a finite number"),
        ({"rollout": {"temperature": "nan"}}, None, "rollout.temperature: Input should be a"),
        ({"rollout": {"top_p": "nan"}}, None, "rollout.top_p: Input should be a finite"),
        ({"rollout": {"tool_timeout_s": "inf"}}, None, "rollout.tool_timeout_s: Input should"),
        ({"abf": {"delta": "inf"}}, None, "abf.delta: Input should be a finite number"),
        ({"abf": {"oversample": "inf"}}, None, "abf.oversample: Input should be a finite"),
        ({"abf": {"oversample": 1e9}}, None, "abf.oversample: Input should be less than or"),
        ({"sandbox": {"wall_seconds_per_call": "inf"}}, None, "wall_seconds_per_call: inf is"),
        ({"seed": -1}, None, "seed: Input should be greater than or equal to 0"),
        ({"verl": {"gpu_memory_utilization": "nan"}}, None, "verl.gpu_memory_utilization: In"),
    ],
)
def test_a_non_finite_or_out_of_range_number_is_refused_naming_it(
    tmp_path: Path, wide_consoles: None, patch: dict, env: dict | None, named: str
) -> None:
    refused_before_anything(tmp_path, patch, env, named)


def test_group_size_1_is_refused_by_the_config(tmp_path: Path, wide_consoles: None) -> None:
    code, out = rl("--config", str(recipe(tmp_path, tmp_path, tmp_path)), "--group-size", "1")
    assert code == 2 and "group_size: Input should be greater than or equal to 2" in out
    assert not (tmp_path / "run").exists()


def test_a_micro_batch_that_does_not_divide_the_step_is_refused_before_anything(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    cfg = recipe(tmp_path, tiny_fp32, data["ok"], micro_batch_size=3)
    code, out = rl("--config", str(cfg))
    assert code == 2 and "micro_batch_size=3 must divide the step's 2 episodes" in out, out
    assert not (tmp_path / "run").exists()  # checked before the run directory is written


@pytest.mark.parametrize("which", ["train", "heldout"])
def test_a_missing_record_file_is_refused_before_anything(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None, which: str
) -> None:
    gone = tmp_path / "gone.jsonl"
    over = {"heldout_files": [str(gone)]} if which == "heldout" else {}
    cfg = recipe(tmp_path, tiny_fp32, gone if which == "train" else data["ok"], **over)
    code, out = rl("--config", str(cfg))
    assert code == 2 and f"arena records not found: {gone}" in out, out
    assert not (tmp_path / "run").exists()


def test_records_that_all_fail_to_load_are_refused_with_the_first_reason(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    code, out = rl("--config", str(recipe(tmp_path, tiny_fp32, data["all_bad"])))
    assert code == 2 and "no loadable training task" in out and "3 record(s)" in out, out
    assert "record 0, sub_qa_dict: missing" in out and "Traceback" not in out
    assert not (tmp_path / "run").exists()


def _not_a_checkpoint(tmp_path: Path, kind: str, tiny: Path) -> Path:
    p = tmp_path / kind
    if kind == "missing":
        return p
    if kind == "a-file":
        p.write_text("hi")
        return p
    p.mkdir()
    if kind == "config-only":
        (p / "config.json").write_text("{}")
    elif kind == "garbage-weights":
        (p / "config.json").write_text((tiny / "config.json").read_text())
        (p / "model.safetensors").write_bytes(os.urandom(100))
    elif kind == "no-tokenizer":
        for f in tiny.iterdir():
            if "token" not in f.name and "template" not in f.name:
                (p / f.name).write_bytes(f.read_bytes())
    return p


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("missing", "checkpoint not found"),
        ("a-file", "is not a directory"),
        ("empty-dir", "it has no config.json"),
        ("config-only", "has a config.json but no weights"),
        ("garbage-weights", "is corrupt or truncated"),
        ("no-tokenizer", "has no chat template (are its tokenizer files missing?)"),
    ],
    ids=["missing", "a-file", "empty-dir", "config-only", "garbage-weights", "no-tokenizer"],
)
def test_a_model_path_that_is_not_a_checkpoint_is_refused(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None, kind: str,
    says: str,
) -> None:  # fmt: skip
    model = _not_a_checkpoint(tmp_path, kind, tiny_fp32)
    code, out = rl("--config", str(recipe(tmp_path, model, data["ok"])))
    assert code == 2 and says in out and "Traceback" not in out, out
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------- records, one by one


def test_records_that_fail_to_load_are_skipped_with_reasons(data: dict[str, Path]) -> None:
    tasks, skipped = load_tasks([data["mixed"]])
    assert [t.task_id for t in tasks] == ["ok", "ok-2"]
    assert [t.index for t in tasks] == [0, 4]  # a record's place in the file, bad ones counted
    p = data["mixed"]
    assert skipped[0].startswith(f"{p}:2: not a JSON record")
    assert skipped[1] == f"{p}:3: record 2, sub_qa_dict: missing"
    assert skipped[2].startswith(f"{p}:4: record 3, tool_dict: source of '{TOOL}' does not compile")
    assert len(skipped) == 3


def test_unicode_prompts_load_and_lone_surrogates_are_replaced(data: dict[str, Path]) -> None:
    tasks, skipped = load_tasks([data["unicode"]])
    assert skipped == [] and [t.task_id for t in tasks] == ["emoji", "separators", "surrogate"]
    assert tasks[0].prompt[0]["content"].endswith("\U0001f600\U0001f30d é中")
    assert tasks[1].prompt[0]["content"] == "line\u2028sep\u2029para\x85next"
    assert tasks[2].prompt[0]["content"] == "broken \ufffd half"


def test_a_run_skips_the_bad_records_says_how_many_and_trains(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    code, out = rl("--config", str(recipe(tmp_path, tiny_fp32, data["mixed"])))
    assert code == 0, out
    assert "skipped 3 record(s) that failed to load" in out and "trained 1 steps" in out
    assert [m["step"] for m in metrics(tmp_path / "run")] == [1]


def test_unicode_prompts_roll_out_and_train(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    """Emoji, raw line separators and a (replaced) lone surrogate: each task's episodes are
    sampled, scored and trained; none is an error."""
    cfg = recipe(tmp_path, tiny_fp32, data["unicode"], batch_groups=3, micro_batch_size=2)
    code, out = rl("--config", str(cfg))
    assert code == 0, out
    (m,) = metrics(tmp_path / "run")
    assert m["episode_errors"] == 0 and m["sampled_tokens"] > 0 and m["solved"] == 1.0


# ------------------------------------------------------------------------ resume and kill -9


def _tree(run: Path) -> dict[str, int]:
    return {str(p.relative_to(run)): p.stat().st_size for p in sorted(run.rglob("*"))}


def test_resume_into_another_config_is_refused_and_the_same_config_resumes(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    run = tmp_path / "run"
    cfg = recipe(tmp_path, tiny_fp32, data["ok"])
    code, out = rl("--config", str(cfg))
    assert code == 0, out
    before = _tree(run)
    code, out = rl("--config", str(cfg), "--learning-rate", "0.01", "--seed", "3")
    assert code == 2 and "holds a run of a different config" in out, out
    assert "learning_rate (2e-06 → 0.01)" in out and "seed (0 → 3)" in out
    assert _tree(run) == before  # nothing touched
    code, out = rl("--config", str(cfg))  # the same config: the run had finished, a no-op
    assert code == 0 and "holds a finished run (1 steps): nothing to do" in out, out
    assert _tree(run) == before and [m["step"] for m in metrics(run)] == [1]


def _files(run: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def test_a_finished_run_reruns_as_a_no_op_and_completes_a_missing_final(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    """3 steps of 2-step epochs: resumed from its last checkpoint, TRL would train a 4th step
    and overwrite final/ and final-bf16/."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    cfg = recipe(tmp_path, tiny_fp32, data["two"], steps=3, convert={"enabled": True})
    code, out = rl("--config", str(cfg))
    assert code == 0 and "trained 3 steps" in out, out
    before = _files(run)
    code, out = rl("--config", str(cfg))
    assert code == 0 and f"{run} holds a finished run (3 steps): nothing to do" in out, out
    assert _files(run) == before  # nothing touched, nothing trained
    # killed after its last checkpoint, before final/ was written
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "final-bf16")
    code, out = rl("--config", str(cfg))
    assert code == 0 and "the run had finished at checkpoint-3 (3 steps); written from it: " \
        f"final, {run / 'final-bf16'}" in out, out  # fmt: skip
    assert not (run / "checkpoint-4").exists() and [m["step"] for m in metrics(run)] == [1, 2, 3]
    final = load_file(str(run / "final" / "model.safetensors"))
    ckpt = load_file(str(run / "checkpoint-3" / "model.safetensors"))
    assert final.keys() == ckpt.keys() and all(bool((final[k] == ckpt[k]).all()) for k in ckpt)


def test_a_moved_run_directory_resumes_and_another_config_is_still_refused(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    cfg = recipe(tmp_path, tiny_fp32, data["ok"], steps=2)
    code, out = rl("--config", str(cfg))
    assert code == 0, out
    moved = tmp_path / "moved" / "run"
    shutil.copytree(tmp_path / "run", moved)
    for gone in ("final", "checkpoint-2"):  # as if killed after checkpoint-1
        shutil.rmtree(moved / gone)
    code, out = rl("--config", str(cfg), "--output-dir", str(moved), "--seed", "1")
    assert code == 2 and "seed (0 → 1)" in out, out
    code, out = rl("--config", str(cfg), "--output-dir", str(moved))
    assert code == 0 and f"resumed from {moved / 'checkpoint-1'}" in out, out
    assert "trained 2 steps" in out and [m["step"] for m in metrics(moved)] == [1, 2]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts `cmd &`


@pytest.mark.integration  # a subprocess, signalled
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_rollout_stops_quietly_and_the_rerun_resumes(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], sig: signal.Signals
) -> None:
    """Stopped while step 2's sandboxes load their tool (2 s): one line says it stopped and
    where a rerun resumes, exit 128 + the signal, and nothing else on stderr but the progress
    (and warnings): no "Task exception was never retrieved" of the rollouts cut short, no
    "Event loop is closed" of their sandboxes' pipes. Started with SIGINT ignored, as a
    background job is: Ctrl-C or `kill -INT` still stops it."""
    run = tmp_path / "run"
    cfg = recipe(tmp_path, tiny_fp32, data["slow"], steps=3, rollout={"tool_timeout_s": 20},
                 sandbox={"wall_seconds_per_call": 10})  # fmt: skip
    cmd = [sys.executable, "-m", "training.cli", "rl", "--config", str(cfg)]
    env = {**os.environ, "COLUMNS": "300"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=_ignore_sigint,
    )  # fmt: skip
    try:
        # step 1's record is logged before its checkpoint is saved: wait for both (on a busy
        # machine the save can take longer than the half second below)
        kill_after_records_signal(
            proc, run / "metrics.jsonl", 1, sig, timeout_s=120,
            ready=lambda: last_complete_checkpoint(run) is not None,
        )  # fmt: skip
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err[-3000:]
    ckpt = last_complete_checkpoint(run)
    assert ckpt == run / "checkpoint-1", err[-3000:]
    other = [
        line for line in err.splitlines()
        if line.strip() and not line.startswith(("rl step ", "[transformers]", "WARNING "))
    ]  # fmt: skip
    assert other == [f"stopped by {sig.name}: the same command resumes from {ckpt}"], err
    assert not (run / "final").exists() and not (run / "rollout-weights").exists()
    code, text = rl("--config", str(cfg))
    assert code == 0 and f"resumed from {ckpt}" in text and "trained 3 steps" in text, text
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]


def kill_after_records_signal(
    proc: subprocess.Popen[str],
    path: Path,
    n: int,
    sig: signal.Signals,
    timeout_s: float,
    ready: Callable[[], bool] = lambda: True,
) -> None:
    """Wait until ``path`` (JSONL) holds ``n`` records (and ``ready()``), then send ``sig``
    half a second into the next step's rollout."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (path.is_file() and len(path.read_text().splitlines()) >= n and ready()):
        assert proc.poll() is None, f"the run ended (code {proc.returncode}) before {path} held {n}"
        assert time.monotonic() < deadline, f"{path} did not hold {n} records within {timeout_s} s"
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(sig)


@pytest.mark.integration  # a subprocess, killed
def test_kill_9_mid_run_then_rerun_resumes_from_the_last_complete_checkpoint(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    run = tmp_path / "run"
    cfg = recipe(tmp_path, tiny_fp32, data["ok"], steps=4)
    cmd = [sys.executable, "-m", "training.cli", "rl", "--config", str(cfg)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kill_after_records(proc, run / "metrics.jsonl", 2, timeout_s=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (run / "final").exists()
    last = last_complete_checkpoint(run)
    assert last is not None and last.name in ("checkpoint-1", "checkpoint-2", "checkpoint-3")
    code, out = rl("--config", str(cfg))
    assert code == 0 and f"resumed from {last}" in out and "trained 4 steps" in out, out
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]  # each step once
    for n in range(1, 5):  # every checkpoint complete, the task order carried on
        state = json.loads((run / f"checkpoint-{n}" / "astra-rl-state.json").read_text())
        assert (run / f"checkpoint-{n}" / "trainer_state.json").is_file()
        assert state == {"sampler": {"drawn": n}, "step": n}
    assert (run / "final" / "model.safetensors").is_file()
    assert not [p for p in run.iterdir() if "partial" in p.name or p.name == "rollout-weights"]

    # starting over (resume off) sets the earlier run aside: a later resume cannot mistake its
    # checkpoint-4 for the new run's
    code, out = rl("--config", str(cfg), "--no-resume")
    assert code == 0 and "resumed" not in out, out
    assert (run / "previous-1" / "checkpoint-4" / "trainer_state.json").is_file()
    earlier = MetricsLog.read(run / "previous-1" / "metrics.jsonl")
    assert [m["step"] for m in earlier] == [1, 2, 3, 4]
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]


# ---------------------------------------------------------- failures inside the rollouts


def test_a_tool_that_hangs_or_kills_its_sandbox_is_an_error_result_and_the_step_completes(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    cfg = recipe(
        tmp_path, tiny_fp32, data["hang_crash"], batch_groups=2, micro_batch_size=2,
        rollout={"tool_timeout_s": 5}, sandbox={"wall_seconds_per_call": 1},
    )  # fmt: skip
    code, out = rl("--config", str(cfg))
    assert code == 0 and "trained 1 steps" in out, out
    (m,) = metrics(tmp_path / "run")
    assert m["reward_mean"] == 0.0 and m["episode_errors"] == 0 and m["turns_mean"] == 2.0


@pytest.fixture(scope="module")
def policy_parts(tiny_fp32: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_fp32)).eval()
    return load_tokenizer(tiny_fp32), HFGenerator(model)


def _cfg(tmp_path: Path, tiny: Path, train: Path, **over: Any) -> RLConfig:
    return RLConfig.model_validate(json.loads(recipe(tmp_path, tiny, train, **over).read_text()))


def test_hung_and_crashed_tools_replace_their_worker_and_the_pool_goes_on(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], policy_parts: tuple[Any, Any]
) -> None:
    tok, gen = policy_parts
    cfg = _cfg(tmp_path, tiny_fp32, data["ok"], rollout={"tool_timeout_s": 5})
    settings = settings_of(cfg, tok)
    (hang, crash), _ = load_tasks([data["hang_crash"]])
    (ok,), _ = load_tasks([data["ok"]])

    async def go() -> list[Any]:
        async with SandboxPool(SandboxLimits(wall_seconds_per_call=1)) as pool:
            return [
                await rollout_group(t, 2, gen, tok, pool.environment, settings, seed=0, step=1)
                for t in (hang, crash, ok)
            ]

    hung, crashed, fine = asyncio.run(go())
    for group, says in ((hung, "timed out after 1 s"), (crashed, "crashed: the worker exited")):
        for ep in group.episodes:
            assert [e.status for e in ep.trajectory.events] == ["tool_error"]
            tool_msg = next(m for m in ep.trajectory.messages if m["role"] == "tool")
            assert f"tool '{TOOL}' {says}" in tool_msg["content"], tool_msg
            assert "(the sandbox was replaced)" in tool_msg["content"]
            assert ep.error is None and ep.score == 0.0 and ep.trajectory.termination == "stop"
    # the pool's next episodes get sound sandboxes
    assert all(e.reward is not None and e.reward.fully_solved for e in fine.episodes)


def test_a_megabyte_tool_result_is_refused_or_cut_and_the_context_stays_in_budget(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], policy_parts: tuple[Any, Any]
) -> None:
    tok, gen = policy_parts
    (task,), _ = load_tasks([data["huge"]])

    def episode(limits: SandboxLimits, **rollout: Any) -> Any:
        cfg = _cfg(tmp_path, tiny_fp32, data["ok"], rollout=rollout)

        async def go() -> Any:
            async with SandboxPool(limits) as pool, pool.environment(task) as env:
                return await rollout_episode(task, gen, tok, env, settings_of(cfg, tok), seed=1)

        return asyncio.run(go())

    # past 8 × the sandbox's output cap the result is an error (the episode goes on)
    ep = episode(SandboxLimits())
    tool = next(m for m in ep.trajectory.messages if m["role"] == "tool")
    assert tool["content"] == "Error: the tool's result is too large to return"
    # within it, the loop keeps head and tail within max_tool_output_chars
    ep = episode(SandboxLimits(output_cap_chars=200_000), max_tool_output_chars=2000)
    tool = next(m for m in ep.trajectory.messages if m["role"] == "tool")
    assert len(tool["content"]) <= 2000 and "characters truncated]" in tool["content"]
    assert tool["content"].startswith("12:00 xxx") and ep.trajectory.events[0].truncated
    assert ep.reward is not None and ep.reward.fully_solved and ep.error is None
    # and a tool result longer than the episode's response budget is cut at it: the trained
    # sequence never exceeds max_prompt_tokens + max_response_tokens
    ep = episode(
        SandboxLimits(output_cap_chars=200_000),
        max_tool_output_chars=200_000, max_response_tokens=256,
    )  # fmt: skip
    rec = ep.trajectory.tokens
    assert rec is not None and len(rec.response_ids) == 256 and rec.sampled_tokens > 0
    assert len(rec.response_mask) == len(rec.logprobs) == 256
    assert ep.trajectory.termination == "length"


def test_text_the_tokenizer_cannot_take_ends_the_episode_not_the_rollout(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], policy_parts: tuple[Any, Any]
) -> None:
    """A prompt that reaches the policy with a lone surrogate (not through load_tasks, which
    replaces them): a model error on that episode, with its reason."""
    tok, gen = policy_parts
    raw = record("raw-surrogate", prompt="broken \ud800 half")
    task, _ = parse_record(raw, 0)
    assert task is not None
    cfg = _cfg(tmp_path, tiny_fp32, data["ok"])

    async def go() -> Any:
        async with SandboxPool() as pool, pool.environment(task) as env:
            return await rollout_episode(task, gen, tok, env, settings_of(cfg, tok), seed=1)

    ep = asyncio.run(go())
    assert ep.trajectory.termination == "model_error" and not ep.trainable
    assert ep.error is not None and "chat template or tokenizer failed" in ep.error


def test_every_group_flat_stops_with_batch_filling_stalled_and_frees_the_directory(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    """The scripted model scores the same on every rollout: no group's rewards ever vary."""
    import time

    cfg = recipe(tmp_path, tiny_fp32, data["never"], abf={"enabled": True, "max_flat_rounds": 2})
    t0 = time.monotonic()
    code, out = rl("--config", str(cfg))
    assert code == 1 and "Traceback" not in out, out
    assert "Adaptive Batch Filling: 2 rounds in a row produced no group whose rewards vary" in out
    assert "1 of 1 groups still missing at step 1" in out and time.monotonic() - t0 < 90
    assert metrics(tmp_path / "run") == []
    # nothing was saved: another config may take the directory (no "different config")
    code, out = rl("--config", str(cfg), env={"ASTRA_TRAIN_ABF__ENABLED": "false"})
    assert code == 0 and "trained 1 steps" in out, out


def test_no_prompt_within_max_prompt_tokens_stops_the_run_saying_so(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path], wide_consoles: None
) -> None:
    cfg = recipe(tmp_path, tiny_fp32, data["ok"], rollout={"max_prompt_tokens": 16})
    code, out = rl("--config", str(cfg))
    assert code == 1 and "all 2 episodes rolled out for step 1 failed" in out, out
    assert "over max_prompt_tokens=16" in out and "Traceback" not in out
    assert metrics(tmp_path / "run") == []


def test_the_hf_engine_samples_the_policy_it_trains(
    tmp_path: Path, tiny_fp32: Path, data: dict[str, Path]
) -> None:
    code, out = rl("--config", str(recipe(tmp_path, tiny_fp32, data["ok"])))
    assert code == 0, out
    (m,) = metrics(tmp_path / "run")
    assert m["logp_gap"] < 1e-4 and m["reward_mean"] > 0.99
