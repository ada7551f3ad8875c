"""Environments that would teach reward hacking are not kept: a tool whose answer needs none of
the task's values (whatever its signature), tool code that tries what the sandbox refuses
(inside try/except), leaves a thread running or floods its output; `synth arenas` and
`astra-eval arenas validate` find the same in existing records; and the env-code flags refuse
0 and negative limits instead of replacing them by the defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent.sandbox import bwrap_available
from eval.arenas.checks import blind_arguments, vary_arguments
from tests.training.test_synth_envs import MODEL, decomposition, env_config, read, write
from training.synth.cli import synth_app
from training.synth.envs.build import arena_record
from training.synth.envs.code import CheckLimits, EnvRecord, EnvStep, synth_env_code
from training.synth.envs.sandboxed import EnvTool
from training.synth.stage import Provenance
from training.testing import ScriptedTeacher, scripted_teacher_server

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")

REFUSED = {  # plant → (reason, what the rejection says)
    "noargs": ("answer_without_arguments", "with nothing of the task in its call"),
    "flag": ("answer_for_other_arguments", '{"detailed": false}) also returns the sub-answer'),
    "pick": ("answer_for_other_arguments", '{"kind": "latest"}) also returns'),
    "items": ("answer_for_other_arguments", "also returns the sub-answer 'Sella-7'"),
    "socket_caught": ("forbidden_operation", "tried network access, which the sandbox refused"),
    "subprocess_caught": ("forbidden_operation", "tried starting programs"),
    "system_caught": ("forbidden_operation", "tried running shell commands"),
    "thread": ("thread_left", "left 1 thread(s) running after it returned"),
    "flood": ("too_much_output", "printed 104,857,601 characters (at most 8,192)"),
    "flood_load": ("too_much_output", "loading lookup_river_crosses_town_flood printed 52,428,801"),
}
KEPT = ("good", "joined", "chatty", "tmpfile")


def test_blind_call_varies_every_kind_of_value() -> None:
    params = {"type": "object", "properties": {
        "flag": {"type": "boolean"}, "unit": {"type": "string", "enum": ["C", "F"]},
        "one": {"type": "string", "enum": ["only"]},
        "ids": {"type": "array", "items": {"type": "string"}},
        "filt": {"type": "object", "properties": {"n": {"type": "integer"}}}}}  # fmt: skip
    args = {"flag": True, "unit": "F", "one": "only", "ids": ["a", "b"], "filt": {"n": 3},
            "none": None}  # fmt: skip
    varied = vary_arguments(params, args)
    assert varied["flag"] is False and varied["unit"] == "C" and varied["one"] == "only"
    assert "a" not in varied["ids"] and len(varied["ids"]) == 2 and varied["filt"]["n"] != 3
    assert varied["none"] is None
    assert vary_arguments({"type": "object", "properties": {}}, {}) == {}  # nothing to vary
    # a probe value that holds the answer proves nothing: the other set, else no blind call
    assert blind_arguments({}, {"q": "k"}, ["zz-no-such-value"]) == {"q": "qq-other-entry"}
    assert blind_arguments({}, {"q": "k"}, ["zz-no-such-value", "qq-other-entry"]) is None


@pytest.mark.integration
@needs_bwrap
async def test_env_code_refuses_constant_answers_and_misconduct(tmp_path: Path) -> None:
    kinds = [*REFUSED, *KEPT]
    records = [
        decomposition(kind, (f"Which river crosses town-{kind}? [key:town-{kind}] "
                             f"[plant:{kind}]", "Sella-7"))
        for kind in kinds
    ]  # fmt: skip
    path = write(tmp_path / "d.jsonl", records)
    # The floods print 100 MB per call and 50 MB at load: under load that outlasted the
    # suite's 0.5 s per call (call_timeout, not too_much_output), so the time limits are wide.
    wide = CheckLimits(wall_seconds_per_call=10.0, load_seconds_per_tool=20.0)
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        stats = await synth_env_code(
            env_config(path, tmp_path / "out", srv.base_url, max_retries=0, sandbox=wide)
        )
    kept = {r["id"]: r for r in read(tmp_path / "out" / "envs.jsonl")}
    rejected = {r["source"]: r for r in read(tmp_path / "out" / "rejections.jsonl")}
    assert set(kept) == set(KEPT) and stats.environments == len(KEPT)
    for kind, (reason, says) in REFUSED.items():
        r = rejected[kind]
        assert r["reason"] == reason and says in r["detail"], (kind, r["detail"])
    assert "Sella-7" in kept["chatty"]["steps"][0]["output"]  # what it printed is kept


def _tool(name: str, source: str, props: dict[str, Any] | None = None) -> EnvTool:
    params = {"type": "object", "properties": props or {}, "required": list(props or {})}
    return EnvTool(name=name, description=f"The {name} tool.", parameters=params,
                   source=source, serves=["q1"])  # fmt: skip


QUERY = {"query": {"type": "string"}}
LOOKUP = "def {name}(query):\n    return {{'Arvel': 'K-77'}}.get(query, 'unknown key')\n"
ARENA_CASES: dict[str, tuple[list[EnvTool], list[tuple[str, dict[str, Any], str]], str]] = {
    # id: (tools, reference steps (tool, arguments, answer), what validation says; "" = valid)
    "good": ([_tool("find_code", LOOKUP.format(name="find_code"), QUERY)],
             [("find_code", {"query": "Arvel"}, "K-77")], ""),
    "stateful": (  # a parameterless tool that reads what the step before it stored: valid
        [_tool("open_case", "def open_case(query):\n    open('/tmp/case', 'w').write(query)\n"
               "    return {'opened': query, 'case': 'C-' + str(len(query) * 7)}\n", QUERY),
         _tool("case_owner", "import os\ndef case_owner():\n    if not os.path.exists("
               "'/tmp/case'):\n        return 'no open case'\n    return 'owner: Mirelle Sand'\n")],
        [("open_case", {"query": "Arvel"}, "C-35"), ("case_owner", {}, "Mirelle Sand")], ""),
    "noargs": ([_tool("current_code", "def current_code():\n    return 'K-77'\n")],
               [("current_code", {}, "K-77")], "with nothing of the task in its call"),
    "flag": ([_tool("code_of", "def code_of(full):\n    return 'code K-77'\n",
                    {"full": {"type": "boolean"}})],
             [("code_of", {"full": True}, "K-77")], "also returns the sub-answer 'K-77'"),
    "socket": ([_tool("find_code", "import socket\n" + LOOKUP.format(name="_f") +
                      "def find_code(query):\n    try:\n        socket.socket()\n"
                      "    except OSError:\n        pass\n    return _f(query)\n", QUERY)],
               [("find_code", {"query": "Arvel"}, "K-77")], "tried network access"),
    "thread": ([_tool("find_code", "import threading, time\n" + LOOKUP.format(name="_f") +
                      "def find_code(query):\n    threading.Thread(target=time.sleep, args=(60,),"
                      " daemon=True).start()\n    return _f(query)\n", QUERY)],
               [("find_code", {"query": "Arvel"}, "K-77")], "left 1 thread(s) running"),
    "loud_load": ([_tool("find_code", "print('z' * 70000)\n" + LOOKUP.format(name="find_code"),
                         QUERY)],
                  [("find_code", {"query": "Arvel"}, "K-77")], "loading find_code printed 70,001"),
    "echo": ([_tool("find_code", "def find_code(query):\n    return query\n", QUERY)],
             [("find_code", {"query": "code K-77"}, "K-77")], "hold its answer 'K-77'"),
}  # fmt: skip


def _env(rid: str) -> EnvRecord:
    tools, steps, _ = ARENA_CASES[rid]
    return EnvRecord(
        id=rid, domain="registry", question=f"What is the code of Arvel ({rid})?",
        answer=steps[-1][2], tools=tools,
        steps=[EnvStep(subquestion=f"q{i}", question=f"step {i}", tool=t, arguments=a,
                       answer=ans) for i, (t, a, ans) in enumerate(steps, 1)],
    )  # fmt: skip


@pytest.mark.integration
@needs_bwrap
def test_synth_arenas_and_arenas_validate_refuse_such_records(tmp_path: Path) -> None:
    envs = [_env(rid) for rid in ARENA_CASES]
    (tmp_path / "envs.jsonl").write_text("".join(e.model_dump_json() + "\n" for e in envs))
    args = ["arenas", "--envs", str(tmp_path / "envs.jsonl"), "--out", str(tmp_path / "arenas"),
            "--near", "0", "--far", "0", "--heldout", "0"]  # fmt: skip
    res = CliRunner().invoke(synth_app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    kept = {r["task_id"] for r in read(tmp_path / "arenas" / "arenas.jsonl")}
    rejected = {r["id"]: r for r in read(tmp_path / "arenas" / "rejections.jsonl")}
    assert kept == {"good", "stateful"}
    for rid, (_, _, says) in ARENA_CASES.items():
        if says:
            r = rejected[rid]
            assert r["reason"] == "invalid_arena" and says in r["detail"], (rid, r["detail"])
    # the same records as existing data, made without those checks: validate finds them
    prov = Provenance(stage="arenas", run="x", code_version="x", inputs=[], created="x")
    data = tmp_path / "existing.jsonl"
    data.write_text("".join(arena_record(e, [], "train", prov).model_dump_json() + "\n"
                            for e in envs))  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "eval", "arenas", "validate", str(data)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    n = len(ARENA_CASES)
    assert f"{n} loaded, 2 validated in the sandbox, {n - 2} problem(s)" in out.stdout
    for i, (rid, (_, _, says)) in enumerate(ARENA_CASES.items()):
        lines = [x for x in out.stderr.splitlines() if f"record {i} ({rid})" in x]
        assert bool(lines) == bool(says) and all(says in x for x in lines), (rid, lines)


def _env_code_cli(tmp_path: Path, *flags: str) -> Any:
    path = write(tmp_path / "d.jsonl", [decomposition("r", ("Which river? [key:k]", "Sella-7"))])
    args = ["env-code", "--decompositions", str(path), "--out", str(tmp_path / "out"),
            "--base-url", "http://127.0.0.1:9/v1", *flags]  # fmt: skip
    return CliRunner().invoke(synth_app, args, env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--max-attempts", "0"], "--max-attempts 0: Input should be greater than or equal to 1"),
        (["--max-attempts", "-3"], "--max-attempts -3: Input should be greater than or equal"),
        (["--call-timeout", "0"], "--call-timeout 0.0: Input should be greater than 0"),
        (["--call-timeout", "-0.5"], "--call-timeout -0.5: Input should be greater than 0"),
        (["--call-timeout", "inf"], "--call-timeout inf: Input should be a finite number"),
        (["--call-timeout", "1e308"], "--call-timeout 1e+308: Input should be less than or"),
        (["--max-retries", "-1"], "--max-retries -1: Input should be greater than or equal to 0"),
        (["--sandboxes", "0"], "--sandboxes 0: Input should be greater than or equal to 1"),
    ],
)
def test_env_code_flags_refuse_zero_and_negative_limits(
    tmp_path: Path, flags: list[str], says: str
) -> None:
    res = _env_code_cli(tmp_path, *flags)
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()  # one line
    assert line.startswith(f"error: {says}"), line
    assert not (tmp_path / "out").exists()  # nothing started


def test_the_other_stages_pass_zero_through_too(tmp_path: Path) -> None:
    cases = {
        "tasks": ["--max-attempts", "0"], "decompose": ["--max-attempts", "0"],
        "interact": ["--max-attempts", "0"], "judge": ["--max-attempts", "0"],
        "confirm": ["--max-attempts", "0"], "check-chains": ["--max-attempts", "0"],
    }  # fmt: skip
    for command, flags in cases.items():
        res = CliRunner().invoke(synth_app, [command, "--out", str(tmp_path / command), *flags])
        assert res.exit_code == 2 and "--max-attempts 0: Input should be" in res.output, res.output
    res = CliRunner().invoke(synth_app, ["tasks", "--out", str(tmp_path / "t"), "--modes", " , "])
    assert res.exit_code == 2 and "--modes" in res.output, res.output  # not silently "all"


@pytest.mark.integration
@needs_bwrap
def test_flags_given_override_the_config_file_zero_and_false_too(tmp_path: Path) -> None:
    """--max-retries 0 is honoured (one round), and --no-resume overrides a config's resume."""
    question = "Which river crosses town-r? [key:town-r] [plant:socket@1]"
    path = write(tmp_path / "d.jsonl", [decomposition("r", (question, "Sella-7"))])
    out, cfg = tmp_path / "out", tmp_path / "c.yaml"
    cfg.write_text("max_retries: 3\nresume: true\nsandbox: {wall_seconds_per_call: 0.5}\n")
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        base = ["env-code", "--decompositions", str(path), "--out", str(out), "-c", str(cfg),
                "--base-url", srv.base_url, "--model", MODEL, "--max-retries", "0"]  # fmt: skip
        res = CliRunner().invoke(synth_app, base)
        assert res.exit_code == 0 and len(srv.requests) == 1, res.output
        (rejection,) = read(out / "rejections.jsonl")
        assert "after 1 tries" in rejection["detail"]  # 0 retries, not the default 3
        assert CliRunner().invoke(synth_app, base).exit_code == 0  # resume: the run is complete
        res = CliRunner().invoke(synth_app, [*base, "--no-resume"])
        assert res.exit_code == 2 and "--overwrite" in res.output, res.output
