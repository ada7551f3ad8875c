"""τ² runs in the readers: `eval/rundir.py` (kind, records, summaries; bad lines, wrong types,
half-written runs), `astra-eval compare` (per conversation and per task; runs of another τ²
data version or user simulator refused) and `astra-eval report` (the τ² section beside the
paper's figures, a conversation's drill-down, in headless Chromium). Records written by the
real record class and summary; real runs made by `astra-eval tau2` against the gold replay
model (a fake model) over HTTP, one with a planted failure and a planted endpoint error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import Reply, Script, ScriptedServer
from astra_agent.trajectory import append_jsonl
from eval.compare import compare_runs
from eval.page import render_report
from eval.results import CONFIG, RESULTS, SUMMARY, RunMeta, write_json_atomic
from eval.rundir import detect_kind, load_run
from eval.tau2.replay import AGENT_MARK, replay_script
from eval.tau2.runner import Tau2Record, summarize
from tests.conftest import run_module
from tests.eval.test_compare import compare_json
from tests.eval.test_report import CHROMIUM, entry_views

DATA = {"inspect_evals": "0.26.0", "inspect_ai": "0.3.285", "tau2_task_version": "4-A"}
SIMULATOR = {"model": "sim", "temperature": 0.0, "top_p": 0.95, "top_k": 20, "max_tokens": None}
FAST_FAIL = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "0", "ASTRA_EVAL_USER__MAX_RETRIES": "0"}


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return run_module("eval", *args, timeout=600, env={"COLUMNS": "250", **(env or {})})


# ------------------------------------------------------------------ runs written by hand


def rec(task: str, trial: int, reward: float | None, domain: str = "retail") -> Tau2Record:
    error = {"error": "user: HTTP 500", "error_kind": "inference"} if reward is None else {}
    return Tau2Record(
        id=f"{domain}/{task}/{trial}", domain=domain, task_id=task, trial=trial, reward=reward,
        explanation="" if reward else "Action 0_1 was not performed.\nDB hash differs.",
        termination="error" if reward is None else "stop", **error,
    )  # fmt: skip


def write_tau2(
    out: Path, records: list[Tau2Record], *, summary: bool = True, **fingerprint: Any
) -> Path:
    """A τ² run directory as `astra-eval tau2` writes it: config.json (the runner's
    fingerprint), results.jsonl, summary.json."""
    out.mkdir(parents=True)
    fp = {"model": out.name, "temperature": 0.0, "user_simulator": SIMULATOR, "data": DATA,
          "message_limit": 100, **fingerprint}  # fmt: skip
    write_json_atomic(out / CONFIG, RunMeta(fingerprint=fp).model_dump(mode="json"))
    for r in records:
        append_jsonl(out / RESULTS, r, fsync=False)
    if summary:
        trials = max(r.trial for r in records)
        data = summarize(records, trials).written()
        data |= {"data": fp["data"], "user_simulator": fp["user_simulator"], "model": out.name,
                 "total": len(records), "complete": True, "wall_s": 1.0}  # fmt: skip
        write_json_atomic(out / SUMMARY, data)
    return out


def test_a_tau2_run_is_told_by_its_summary_its_fingerprint_or_its_first_record(
    tmp_path: Path,
) -> None:
    recs = [rec("0", 1, 1.0), rec("0", 2, 0.0)]
    assert detect_kind(write_tau2(tmp_path / "a", recs)) == "tau2"
    assert detect_kind(write_tau2(tmp_path / "b", recs, summary=False)) == "tau2"
    (tmp_path / "b" / CONFIG).unlink()
    assert detect_kind(tmp_path / "b") == "tau2"  # the first record's fields


def test_a_half_written_run_is_summarized_from_its_records_with_its_settings(
    tmp_path: Path,
) -> None:
    recs = [rec("0", 1, 1.0), rec("0", 2, 0.0), rec("1", 1, 1.0), rec("1", 2, None)]
    out = write_tau2(tmp_path / "a", recs, summary=False)
    with (out / RESULTS).open("a") as f:
        f.write(rec("2", 1, 1.0).model_dump_json()[:80])  # killed mid-write
    run = load_run(out)
    assert run.kind == "tau2" and run.partial and len(run.records) == 4
    assert any("last line is cut off" in p for p in run.problems)
    s = run.summary
    assert s is not None and s["conversations"] == 4 and s["errors"] == 1 and s["trials"] == 2
    # task 1's errored trial leaves it out of pass^k (an error is never a failure)
    assert s["domains"]["retail"]["pass_hat_k"] == {"1": 0.5, "2": 0.0}
    assert s["data"] == DATA and s["user_simulator"] == SIMULATOR and s["model"] == "a"


def test_records_of_the_wrong_types_are_skipped_by_line(tmp_path: Path) -> None:
    out = write_tau2(tmp_path / "a", [rec("0", 1, 1.0), rec("1", 1, 0.0)])
    good = json.loads(rec("2", 1, 1.0).model_dump_json())
    for bad in ({**good, "reward": "1.0"}, {**good, "trial": "1"}, {**good, "user_side": {}}):
        append_jsonl(out / RESULTS, bad, fsync=False)
    run = load_run(out)
    assert [r["id"] for r in run.records] == ["retail/0/1", "retail/1/1"]
    text = "\n".join(run.problems)
    for n, field in ((3, "reward"), (4, "trial"), (5, "user_side")):
        assert f"line is not a tau2 record ({field}: " in text and f"(line {n})" in text
    assert run.summary is not None and run.summary["conversations"] == 2


def test_compare_pairs_conversations_and_tasks_across_other_trial_counts(tmp_path: Path) -> None:
    a = [rec(t, k, 1.0 if t in "01" else 0.0) for t in "01234567" for k in (1, 2)]
    # B: 0 passes one of two trials (worse), 2..6 pass (better), 1 has one trial only (same,
    # 1/1 against 2/2), 7 an error only (unscored), 8 in B only (unscored).
    b = [rec("0", 1, 1.0), rec("0", 2, 0.0), rec("1", 1, 1.0), rec("7", 1, None)]
    b += [rec(t, k, 1.0) for t in "23456" for k in (1, 2)] + [rec("8", 1, 1.0)]
    c = compare_runs(write_tau2(tmp_path / "a", a), write_tau2(tmp_path / "b", b))
    d = c.to_dict()
    assert d["kind"] == "tau2"
    assert d["counts"] == {
        "fixed": 10, "broken": 1, "changed_error": 0, "both_fail": 0, "both_pass": 2,
        "errors": 1, "only_a": 2, "only_b": 1,
    }  # fmt: skip
    tasks = {t["task_id"]: t for t in d["tasks"]}
    assert (tasks["0"]["change"], tasks["0"]["a_passed"], tasks["0"]["b_passed"]) == ("worse", 2, 1)
    assert tasks["1"]["change"] == "same" and (tasks["1"]["a_trials"], tasks["1"]["b_trials"]) == (
        2,
        1,
    )
    assert tasks["7"]["change"] == "unscored" and tasks["7"]["b_errors"] == 1
    assert tasks["8"]["change"] == "unscored" and tasks["8"]["a_trials"] == 0
    assert d["task_counts"]["all"] == {"better": 5, "worse": 1, "same": 1, "unscored": 2}
    mcnemar, sign = d["tests"]
    # By hand: conversations 10 fixed vs 1 broken, two-sided 2 * (1 + 11) / 2^11; tasks 5
    # better vs 1 worse, 2 * (1 + 6) / 2^6.
    assert mcnemar["name"] == "McNemar exact (conversations, paired by id)"
    assert mcnemar["p_value"] == pytest.approx(24 / 2048, abs=1e-12) and mcnemar["n"] == 11
    assert sign["name"].startswith("sign test") and sign["n"] == 6 and sign["statistic"] == 5
    assert sign["p_value"] == pytest.approx(14 / 64, abs=1e-12)
    assert "5 better vs 1 worse of 7 tasks" in sign["note"]
    assert d["groups"]["retail"] == {"a": round(3 / 13, 4), "b": round(12 / 13, 4), "n": 13}
    row = next(r for r in d["rows"] if r["id"] == "retail/0/2")
    assert row["change"] == "broken" and row["b_error"] == "Action 0_1 was not performed."
    json.dumps(d)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"data": {**DATA, "tau2_task_version": "4-B"}}, "different τ² data version"),
        ({"data": {**DATA, "inspect_evals": "0.27.0"}}, "(inspect_evals differs)"),
        ({"user_simulator": {**SIMULATOR, "model": "gpt-5.1"}}, "different user simulator"),
        ({"user_simulator": {**SIMULATOR, "temperature": 0.7}}, "(temperature differs)"),
    ],
)
def test_compare_refuses_another_data_version_or_user_simulator(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    recs = [rec("0", 1, 1.0)]
    a = write_tau2(tmp_path / "a", recs)
    b = write_tau2(tmp_path / "b", recs, **change)
    with pytest.raises(ConfigError, match="cannot compare τ² runs") as err:
        compare_runs(a, b)
    assert says in err.value.message and str(a) in err.value.message and err.value.exit_code == 2
    assert err.value.hint and "user simulator" in err.value.hint
    (b / SUMMARY).unlink()  # a half-written run is refused alike (its config.json says)
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        compare_runs(a, b)


def test_compare_refuses_a_run_that_does_not_say_its_settings(tmp_path: Path) -> None:
    a = write_tau2(tmp_path / "a", [rec("0", 1, 1.0)])
    b = write_tau2(tmp_path / "b", [rec("0", 1, 0.0)], summary=False)
    (b / CONFIG).unlink()
    with pytest.raises(ConfigError, match=f"{b} does not say its τ² data version"):
        compare_runs(a, b)
    other = write_tau2(tmp_path / "c", [rec("0", 1, 0.0)], message_limit=30)
    assert "message limits differ (100 vs 30)" in compare_runs(a, other).warnings[0]


def test_the_report_names_the_settings_and_shows_errors_and_the_scorer(tmp_path: Path) -> None:
    recs = [rec("0", 1, 1.0), rec("0", 2, 0.0), rec("1", 1, 1.0), rec("1", 2, None)]
    a = write_tau2(tmp_path / "a", recs)
    b = write_tau2(tmp_path / "b", recs, user_simulator={**SIMULATOR, "model": "gpt-5.1"})
    html = render_report([load_run(a), load_run(b)])
    assert 'data-kind="tau2"' in html and "τ²-bench" in html
    assert 'data-metric="pass1.retail" data-run="a">50.00<' in html
    assert "ASTRA-14B-Thinking-v1 (published)" in html and "68.00" in html and "47.37" in html
    assert "inspect-evals 0.26.0 (τ² task version 4-A" in html
    assert "These runs differ in their user simulator (model and sampling)" in html
    assert "a: 1 of 4 conversations could not be played (inference errors)" in html
    # the comparison of two runs of another simulator is refused, and says why
    assert "no comparison of a and b: cannot compare τ² runs with different user" in html
    views = entry_views(html)[0]
    assert [v["status"] for v in views] == ["pass", "fail", "pass", "error"]
    assert views[1]["explanation"].startswith("Action 0_1 was not performed.")
    assert views[3]["error"] == "user: HTTP 500"


# ------------------------------------------------------------------ real runs


def first_task(domain: str) -> str:
    from eval.tau2.runner import load_task

    return str(next(iter(load_task(domain).dataset)).id)  # type: ignore[call-overload]


def planted(fail: str, error: str) -> Script:
    """The gold replay, with conversation ``fail``'s user ending it at once (its task's actions
    never done: a failure) and every request of conversation ``error`` answered HTTP 500."""
    base = replay_script(["retail", "telecom"])

    def script(req: dict[str, Any]) -> Reply:
        tag = str(req.get("user") or "").removeprefix("tau2:")
        if tag == error:
            return Reply(status=500)
        agent = AGENT_MARK in (req["messages"][0].get("content") or "")
        if tag == fail and not agent:
            return Reply(content="Never mind, bye. ###STOP###")
        return base(req)

    return script


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A: the gold replay (retail and telecom, one task, two trials); B: the same with
    retail/0/2 failed and the second telecom conversation an endpoint error; C: retail only,
    with another user simulator."""
    root = tmp_path_factory.mktemp("tau2-runs")
    args = ["--limit", "1", "--trials", "2", "--concurrency", "4"]
    script = replay_script(["retail", "telecom"])  # one replay's state for both endpoints
    with ScriptedServer(script, model="gold") as gold:
        r = cli("tau2", "--base-url", gold.base_url, *args, "--out", str(root / "a"))
        assert r.returncode == 0, r.stderr[-3000:]
        with ScriptedServer(script, model="sim-2") as sim:
            r = cli("tau2", "--base-url", gold.base_url, "--user-base-url", sim.base_url,
                    "--domains", "retail", *args, "--out", str(root / "c"))  # fmt: skip
            assert r.returncode == 0, r.stderr[-3000:]
    error = f"telecom/{first_task('telecom')}/2"
    with ScriptedServer(planted("retail/0/2", error), model="gold") as srv:
        r = cli("tau2", "--base-url", srv.base_url, *args, "--out", str(root / "b"), env=FAST_FAIL)
        assert r.returncode == 0, r.stderr[-3000:]
    return {k: root / k for k in "abc"}


@pytest.mark.integration
def test_compare_two_real_runs_from_the_command(real_runs: dict[str, Path], tmp_path: Path) -> None:
    r, d = compare_json(real_runs["a"], real_runs["b"], tmp_path / "cmp.json")
    assert d["counts"] == {
        "fixed": 0, "broken": 1, "changed_error": 0, "both_fail": 0, "both_pass": 2,
        "errors": 1, "only_a": 0, "only_b": 0,
    }  # fmt: skip
    assert d["task_counts"]["retail"] == {"better": 0, "worse": 1, "same": 0, "unscored": 0}
    assert d["task_counts"]["telecom"] == {"better": 0, "worse": 0, "same": 1, "unscored": 0}
    retail = next(t for t in d["tasks"] if t["domain"] == "retail")
    assert (retail["a_passed"], retail["a_trials"], retail["b_passed"]) == (2, 2, 1)
    text = r.stdout
    assert "compare: two τ² runs" in text and "McNemar exact (conversations" in text
    assert "sign test (tasks" in text and "0 better vs 1 worse of 2 tasks" in text
    assert "changed tasks (first 1 of 1)" in text and "retail/0/2" in text
    refused = cli("compare", str(real_runs["a"]), str(real_runs["c"]))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "different user simulator (model and sampling) (model differs)" in refused.stderr
    assert "has gold (" in refused.stderr and "has sim-2 (" in refused.stderr


@pytest.mark.integration
def test_report_of_real_runs_in_chromium(real_runs: dict[str, Path], tmp_path: Path) -> None:
    partial = tmp_path / "b-partial"
    shutil.copytree(real_runs["b"], partial)
    (partial / SUMMARY).unlink()
    with (partial / RESULTS).open("a") as f:
        f.write('{"id": "retail/1/1", "dom')  # killed mid-write
    out = tmp_path / "report.html"
    r = cli("report", str(real_runs["a"]), str(partial), "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "loaded b-partial (tau2): 4 records (partial)" in r.stdout
    summary = json.loads((real_runs["a"] / SUMMARY).read_text())
    assert CHROMIUM is not None, "no chromium on PATH: scripts/setup-system.sh installs Debian's"
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(out.as_uri())
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=30_000)

        def cell(metric: str, run: str) -> str:
            return str(page.inner_text(f'td[data-metric="{metric}"][data-run="{run}"]'))

        for domain in ("retail", "telecom"):
            k2 = summary["domains"][domain]["pass_hat_k"]["2"]
            assert cell(f"domains.{domain}.pass_hat_k.2", "a") == f"{100 * k2:.2f}" == "100.00"
        assert cell("pass1.retail", "b-partial") == "50.00"  # from the records: 1 of 2
        assert cell("errors", "b-partial") == "1" and "gold (temperature 0.0" in cell(
            "user_simulator", "a"
        )
        assert "τ² task version 4-A" in cell("data", "a")
        page.evaluate("window.astraReport.drawAll()")
        page.wait_for_function("document.body.dataset.charts === 'rendered'", timeout=30_000)
        assert "Comparison: a (A) → b-partial (B)" in page.inner_text("#tau2")
        # The failed conversation opens on the agent's side, the scorer and the simulator's.
        page.evaluate("window.astraReport.buildAll()")
        failed = page.locator('.entries[data-run="b-partial"] details.entry[data-status="fail"]')
        assert failed.count() == 1
        failed.locator(":scope > summary").click()
        failed.locator(".user-side").wait_for(timeout=10_000)
        assert "Scorer: failed" in failed.locator(".scorer").inner_text()
        assert "Never mind, bye. ###STOP###" in failed.locator(".user-side").inner_text()
        gold = page.locator('.entries[data-run="a"] details.entry[data-key^="retail/0/1 "]')
        gold.locator(":scope > summary").click()
        gold.locator(".call").first.wait_for(timeout=10_000)
        assert "Gold action" in gold.locator(".reasoning").first.inner_text()
        assert gold.locator(".msg.tool").count() == gold.locator(".call").count() > 0
        assert "<scenario>" in gold.locator(".user-side").inner_text()
        errors = page.locator('.entries[data-run="b-partial"] details.entry[data-status="error"]')
        assert errors.count() == 1 and "inference error" in errors.inner_text()
        browser.close()
    assert problems == []
