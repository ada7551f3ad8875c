"""`astra-eval` as users run it (subprocesses, scripted servers over real HTTP): the endpoint
dying mid-run, resume across URLs, --retry-errors, partial overalls, bad --out and
--categories, the arenas' domain breakdown and empty files, --version."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.testing.scripted_server import Reply, Script, ScriptedServer
from eval.arenas import DATA_DIR
from eval.arenas.replay import replay_script as arena_replay
from eval.bfcl import load_category
from eval.bfcl.replay import replay_script as bfcl_replay
from tests.conftest import free_port, kill_after_records, run_module

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]
HELDOUT = DATA_DIR / "heldout.jsonl"
FAST_FAIL = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "0"}  # a refused connection fails at once


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("eval", *args, timeout=600, env={"COLUMNS": "250", **(env or {})})


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


_BASE: list[Script] = []


def base_replay(req: dict[str, Any]) -> Reply:
    """The BFCL base replay, for a scripted server in its own process (--script)."""
    if not _BASE:
        _BASE.append(bfcl_replay(list(load_category("base"))))
    return _BASE[0](req)


@contextmanager
def server_process(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The scripted server in a process of its own, so that it can be killed -9."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "astra_agent.testing.scripted_server", "--port", str(port),
         "--script", f"{__name__}:base_replay"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_endpoint_killed_mid_run_stops_then_resumes_on_another_url(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["bfcl", "--categories", "base", "--limit", "12", "--concurrency", "1",
            "--max-connection-failures", "3", "--out", str(out)]  # fmt: skip
    port = free_port()
    with server_process(port) as server:
        run = subprocess.Popen(
            [sys.executable, "-m", "eval", *args, "--base-url", f"http://127.0.0.1:{port}/v1"],
            cwd=ROOT, env={**os.environ, **FAST_FAIL}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        kill_after_records(server, out / "results.jsonl", 3, timeout_s=300)
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, stderr[-2000:]
    assert "the endpoint stopped answering after" in stderr and "--resume" in stderr
    kept = records(out)
    assert 3 <= len(kept) < 12
    assert all(r["valid"] and r["error_kind"] is None for r in kept)  # no failure recorded
    assert json.loads((out / "summary.json").read_text())["complete"] is False
    # Back on another port, reached as localhost: same model and sampling, so it resumes.
    port2 = free_port()
    with server_process(port2):
        again = cli(*args, "--resume", "--base-url", f"http://localhost:{port2}/v1")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "was run against" in again.stderr and f"localhost:{port2}" in again.stderr
    ids = [r["id"] for r in records(out)]
    assert sorted(ids) == sorted(f"multi_turn_base_{i}" for i in range(12))  # each once
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["accuracy"] == {"base": 100.0}
    # A different model behind a URL is another configuration: refused.
    with ScriptedServer(base_replay, model="another-model") as other:
        refused = cli(*args, "--resume", "--base-url", other.base_url)
    assert refused.returncode == 2 and "different configuration (model differ)" in refused.stderr


def flaky(script: Script, broken: list[bool]) -> Script:
    """HTTP 400 for about half the entries while ``broken[0]``, else ``script``."""

    def serve(req: dict[str, Any]) -> Reply:
        first = next(m["content"] for m in req["messages"] if m["role"] == "user")
        if broken[0] and zlib.crc32(first.encode()) % 2:
            return Reply(status=400)
        return script(req)

    return serve


def test_bfcl_retry_errors_reruns_inference_errors_and_partial_overall_is_labelled(
    tmp_path: Path,
) -> None:
    broken = [True]
    script = flaky(bfcl_replay(list(load_category("miss_param"))[:6]), broken)
    args = ["bfcl", "--categories", "miss_param", "--limit", "6", "--out", str(tmp_path)]
    with ScriptedServer(script) as srv:
        first = cli(*args, "--base-url", srv.base_url)
        assert first.returncode == 0, first.stderr[-2000:]
        failed = [r["id"] for r in records(tmp_path) if r["error_kind"] == "inference"]
        assert 1 <= len(failed) < 6
        broken[0] = False
        retry = cli(*args, "--base-url", srv.base_url, "--retry-errors")
    assert retry.returncode == 0, retry.stderr[-2000:]
    assert len(records(tmp_path)) == 6 + len(failed)  # the newer records appended
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["entries"] == 6 and summary["accuracy"] == {"miss_param": 100.0}
    assert summary["inference_errors"] == 0
    assert summary["overall_partial"] is True
    rows = list(csv.reader((tmp_path / "leaderboard.csv").open()))
    assert "partial overall (miss_param)" in rows[1][0]
    assert "(partial)" in retry.stdout and "partial overall (miss_param)" in retry.stdout
    parity = cli("bfcl", "parity", "--out", str(tmp_path))  # each id once
    assert "6 entries re-scored with the official checker: 6 agree" in parity.stdout


@pytest.mark.parametrize("flag", ["--categories", "--ids"])
@pytest.mark.parametrize("value", [",", "", " , ,"])
def test_a_list_naming_nothing_is_a_usage_error(flag: str, value: str, tmp_path: Path) -> None:
    out = cli("bfcl", flag, value, "--out", str(tmp_path / "r"))
    assert out.returncode == 2 and f"{flag} {value!r} names nothing" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["bfcl", "--categories", "base,base"], "--categories"),
        (["bfcl", "--ids", "multi_turn_base_0, multi_turn_base_0"], "--ids"),
        (["tau2", "--domains", "retail,retail"], "--domains"),
        (["general", "--tasks", "astra_arith,astra_arith"], "--tasks"),
    ],
)
def test_a_list_naming_one_thing_twice_is_a_usage_error(
    args: list[str], flag: str, tmp_path: Path
) -> None:
    """Every comma-separated flag of every command (one rule, ``options.comma_names``): a
    repeated name is refused before anything runs, not a traceback from the runner."""
    out = cli(*args, "--out", str(tmp_path / "r"))
    assert out.returncode == 2, out.stderr
    assert f"{flag} names" in out.stderr and "more than once" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["bfcl", "arenas"])
def test_unwritable_out_is_refused_before_anything_runs(command: str, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    extra = ["--data", str(HELDOUT)] if command == "arenas" else ["--limit", "1"]
    for out in (blocker / "out", Path("/sys/kernel")):  # /sys: read-only even for root
        # No endpoint there: checked after --out, it would fail with exit 1 instead.
        res = cli(command, *extra, "--base-url", "http://127.0.0.1:9/v1", "--out", str(out))
        assert res.returncode == 2 and "cannot write results to" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


def test_arenas_by_domain_retry_errors_and_ids(tmp_path: Path) -> None:
    tasks = load_arena_file(HELDOUT).tasks[:6]
    broken = [True]
    args = ["arenas", "--data", str(HELDOUT), "--limit", "6", "--out", str(tmp_path)]
    with ScriptedServer(flaky(arena_replay(tasks), broken)) as srv:
        first = cli(*args, "--base-url", srv.base_url)
        assert first.returncode == 0, first.stderr[-2000:]
        failed = [r for r in records(tmp_path) if r["error_kind"] == "inference"]
        assert failed and all(r["termination"] == "model_error" for r in failed)
        broken[0] = False
        retry = cli(*args, "--base-url", srv.base_url, "--retry-errors")
    assert retry.returncode == 0, retry.stderr[-2000:]
    assert {r["id"] for r in records(tmp_path)} == {t.task_id for t in tasks}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == 6 and summary["fully_solved"] == 1.0
    domains = summary["domains"]
    assert sum(d["tasks"] for d in domains.values()) == 6
    assert set(domains) == {t.domain for t in tasks}
    assert all(d["mean_reward"] == pytest.approx(1.0, abs=1e-4) for d in domains.values())
    assert "by domain" in retry.stdout


def test_arenas_validate_on_an_empty_file_fails_like_a_run(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for args in (["arenas", "validate", str(empty)], ["arenas", "--data", str(empty)]):
        out = cli(*args, "--unsafe-no-sandbox")
        assert out.returncode == 2 and "has no record" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_version_and_shared_options() -> None:
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("astra-eval ")
    for command in ("bfcl", "arenas"):
        text = cli(command, "--help").stdout
        assert "-u" in text and "ASTRA_BASE_URL" in text and "--retry-errors" in text


def test_score_official_result_files_with_our_checker(tmp_path: Path) -> None:
    from eval.bfcl.parity import export_official

    entries = list(load_category("base"))[:3]
    with ScriptedServer(bfcl_replay(entries)) as srv:
        run = cli("bfcl", "--categories", "base", "--limit", "3", "--base-url", srv.base_url,
                  "--out", str(tmp_path / "run"))  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    export_official(records(tmp_path / "run"), tmp_path / "result", "my-model")
    out = cli("bfcl", "score", str(tmp_path / "result"), "--out", str(tmp_path / "score"))
    assert out.returncode == 0, out.stderr[-2000:]
    score = tmp_path / "score" / "my-model" / "multi_turn" / "BFCL_v4_multi_turn_base_score.json"
    head = json.loads(score.read_text().splitlines()[0])
    assert head["accuracy"] == 1.0 and head["total_count"] == 3
    assert "my-model" in out.stdout and "(partial)" in out.stdout
    bad = cli("bfcl", "score", str(tmp_path / "result"), "--out", "/sys/kernel")
    assert bad.returncode == 2 and "cannot write scores to /sys/kernel" in bad.stderr
