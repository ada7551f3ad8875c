"""`astra-train synth confirm` and `synth check-chains` against the scripted teacher over real
HTTP: edges confirmed and refused in batches, malformed verdict lists, chains voted out,
back-translation matches and mismatches, resume, and the outputs read by `synth chains` and
`synth tasks` as they are."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from tests.training.conftest import kill_stage_midway, resume_killed_stage
from training.cli import app as train_app
from training.synth.stage import JOURNAL, UnitsFailed
from training.synth.teacher import ReplyError, parse_reply
from training.synth.tools.chains import ChainConfig, ToolChain, sample_chains
from training.synth.tools.check_chains import CheckChainsConfig, synth_check_chains
from training.synth.tools.confirm import ConfirmConfig, synth_confirm, verdicts_schema
from training.synth.tools.graph import GraphConfig, build_graph
from training.synth.tools.pool import PoolConfig, ToolRecord, build_pool
from training.synth.tools.tasks import TasksConfig, synth_tasks
from training.testing import Plant, ScriptedPlants, ScriptedTeacher, scripted_teacher_server

MODEL = "scripted-teacher"
S = {"type": "string"}
EDGES_LINE = re.compile(r"^Edges \(JSON, numbered\): (.*)$", re.MULTILINE)
OFFERED_LINE = re.compile(r"^Tools offered \(JSON\): (.*)$", re.MULTILINE)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def catalogue(entities: Sequence[str]) -> list[dict[str, Any]]:
    """One server whose listings hang together: ``list_<e>s`` takes the previous entity's id,
    ``get_<e>`` / ``delete_<e>`` take ``<e>_id``."""
    tools = []
    for prev, e in zip([None, *entities], entities, strict=False):
        props = {f"{prev}_id": S} if prev else {}
        for name, desc, params in (
            (f"list_{e}s", f"List {e}s.", props),
            (f"get_{e}", f"Get one {e}.", {f"{e}_id": S}),
            (f"delete_{e}", f"Delete one {e}.", {f"{e}_id": S}),
        ):
            schema = {"type": "object", "properties": params, "required": list(params)}
            tools.append({"name": name, "description": desc, "inputSchema": schema})
    return [{"name": "shop", "domain": "shop", "tools": tools}]


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    """A pool and its graph: 9 tools, 8 proposed edges (3 out of each list_*)."""
    servers = tmp_path / "servers.jsonl"
    servers.write_text(
        "".join(json.dumps(s) + "\n" for s in catalogue(["apple", "berry", "cherry"]))
    )
    build_pool(PoolConfig(out=tmp_path / "pool", servers=servers))
    build_graph(GraphConfig(pool=[tmp_path / "pool"], out=tmp_path / "graph"))
    return tmp_path / "pool", tmp_path / "graph"


def confirm_cfg(graph: Path, out: Path, url: str, **kw: Any) -> ConfirmConfig:
    model = {"base_url": url, "model": MODEL, **kw.pop("model", {})}
    return ConfirmConfig(graph=[graph], out=out, model=model, **{"batch": 3, **kw})


def check_cfg(chains: Path, pool: Path, out: Path, url: str, **kw: Any) -> CheckChainsConfig:
    model = {"base_url": url, "model": MODEL, **kw.pop("model", {})}
    return CheckChainsConfig(chains=[chains], pool=[pool], out=out, model=model, **kw)


def shop(name: str) -> str:
    return f"shop/{name}"


REFUSED = {"shop/list_apples->shop/delete_apple", "shop/list_berrys->shop/get_berry"}
SHORT = "shop/list_cherrys->shop/get_cherry"  # its batch (the last, 2 edges) answers 1 verdict


# ------------------------------------------------------------------ the verdicts' schema


def test_verdicts_must_be_one_per_edge_in_any_order() -> None:
    schema = verdicts_schema(3)
    ok = {"verdicts": [{"edge": n, "consumes": n != 2, "reason": "r"} for n in (3, 1, 2)]}
    assert len(parse_reply(json.dumps(ok), schema).verdicts) == 3
    for edges in ((1, 2), (1, 2, 3, 4), (1, 1, 2), (0, 1, 2)):
        bad = {"verdicts": [{"edge": n, "consumes": True} for n in edges]}
        with pytest.raises(ReplyError) as err:
            parse_reply(json.dumps(bad), schema)
        assert err.value.problem == "schema"
    with pytest.raises(ReplyError, match="consumes"):
        parse_reply('{"verdicts": [{"edge": 1, "consumes": "yes"}]}', verdicts_schema(1))


# ------------------------------------------------------------------ confirm, chains, check, tasks


async def test_the_teacher_checks_filter_the_graph_and_the_chains(
    tmp_path: Path, world: tuple[Path, Path]
) -> None:
    pool, graph = world
    plants = ScriptedPlants(
        refuse=frozenset(REFUSED), short=frozenset({SHORT}), vote_no=frozenset({"delete_berry"})
    )
    # the request written for list_berrys → list_cherrys names them the other way round
    swapped = Plant("list_berrys", "diverse", question="Here is what I am after today: list "
                    "cherrys, then list berrys. What do I end up with?")  # fmt: skip
    teacher = ScriptedTeacher(plants=[swapped], checks=plants)
    with scripted_teacher_server(teacher, MODEL) as srv:
        cfg = confirm_cfg(graph, tmp_path / "confirmed", srv.base_url)
        stats = await synth_confirm(cfg)  # the pool: the one graph's stats.json names
        asked = [r["messages"][0]["content"] for r in srv.requests]
        assert Counter(len(json.loads(EDGES_LINE.findall(p)[-1])) for p in asked) == {3: 2, 2: 3}
        edges = read(cfg.out / "edges.jsonl")
        rejected = read(cfg.out / "rejections.jsonl")
        assert len(edges) == stats.proposed == stats.records == 8
        assert {e["id"] for e in edges if e["confirmed"]} == {
            "shop/list_apples->shop/get_apple", "shop/list_apples->shop/list_berrys",
            "shop/list_berrys->shop/delete_berry", "shop/list_berrys->shop/list_cherrys",
        }  # fmt: skip
        assert all(e["confirmed"] is False for e in edges if e["id"] in REFUSED)
        assert Counter(r["reason"] for r in rejected) == {"judge_no": 2, "edge_confirm:schema": 2}
        assert {r["id"] for r in rejected if r["reason"] == "judge_no"} == REFUSED
        assert all(r["detail"].startswith("planted") for r in rejected if r["reason"] == "judge_no")
        short = [r for r in rejected if r["reason"] == "edge_confirm:schema"]
        assert {r["id"] for r in short} == {SHORT, "shop/list_cherrys->shop/delete_cherry"}
        assert all("numbered 1 to 2" in r["detail"] and '"verdicts"' in r["raw"] for r in short)
        by_id = {e["id"]: e for e in edges}
        assert by_id[SHORT]["judge_reason"] == "not judged (edge_confirm:schema)"
        ok = by_id["shop/list_apples->shop/get_apple"]
        assert ok["judge_reason"] == "its result supplies apple_id"
        prov = ok["provenance"]
        assert prov["stage"] == "confirm" and prov["inputs"] == [ok["id"]]
        assert prov["prompts"] == {"edge_confirm": "edge_confirm.v1"}
        assert prov["teacher"]["model"] == MODEL and prov["detail"]["batch"] == "batch-000000"
        assert prov["detail"]["proposed"]["stage"] == "graph"
        assert (stats.confirmed, stats.refused, stats.unjudged) == (4, 2, 2)
        assert (stats.batches, stats.failed_batches) == (3, 1)
        assert stats.tokens["edge_confirm.v1"].calls == 5 and stats.prompt_tokens > 0
        assert stats.stage == "graph" and stats.check == "confirm" and stats.edges == 4
        assert stats.pools == [str(pool / "pool.jsonl")]
        degrees = {n["name"]: (n["in_degree"], n["out_degree"])
                   for n in read(cfg.out / "nodes.jsonl")}  # fmt: skip
        assert degrees["list_apples"] == (0, 2) and degrees["get_cherry"] == (0, 0)
        assert set(stats.isolated) == {
            shop(t) for t in ("delete_apple", "get_berry", "delete_cherry", "get_cherry")
        }
        # resuming a complete run asks nothing and gives the same stats
        before = len(srv.requests)
        assert await synth_confirm(cfg.model_copy(update={"resume": True})) == stats
        assert len(srv.requests) == before

        # `synth chains` reads the confirmed graph and walks only the confirmed edges
        chain_stats = sample_chains(ChainConfig(graph=[cfg.out], out=tmp_path / "chains", count=20))
        chains = read(tmp_path / "chains" / "chains.jsonl")
        assert chain_stats.possible == len(chains) == 6
        confirmed = {e["id"] for e in edges if e["confirmed"]}
        assert all(set(c["edges"]) <= confirmed for c in chains)

        # check-chains: 2 chains with delete_berry voted out, 1 request maps back reversed
        check = check_cfg(tmp_path / "chains", pool, tmp_path / "checked", srv.base_url)
        srv.requests.clear()
        checked = await synth_check_chains(check)
        kinds = Counter(r["messages"][0]["content"].split("]", 1)[0] for r in srv.requests)
        assert kinds == {"[astra-synth:chain_vote.v1": 6, "[astra-synth:tasks.v1": 4,
                         "[astra-synth:back_translate.v1": 4}  # fmt: skip
        kept = read(check.out / "chains.jsonl")
        rejected = read(check.out / "rejections.jsonl")
        assert sorted(c["tools"] for c in kept) == [
            [shop("list_apples"), shop("get_apple")],
            [shop("list_apples"), shop("list_berrys")],
            [shop("list_apples"), shop("list_berrys"), shop("list_cherrys")],
        ]
        assert Counter(r["reason"] for r in rejected) == {
            "vote_no": 2, "back_translation_mismatch": 1,
        }  # fmt: skip
        voted = [r for r in rejected if r["reason"] == "vote_no"]
        assert all("0 of 1 votes yes: planted: delete_berry" in r["detail"] for r in voted)
        assert all(r["scores"] == {"yes": 0, "votes": 1, "yes_share": 0} for r in voted)
        mismatch = next(r for r in rejected if r["reason"] == "back_translation_mismatch")
        assert mismatch["detail"].startswith(
            "predicted [shop/list_cherrys, shop/list_berrys], "
            "expected [shop/list_berrys, shop/list_cherrys]; request: "
        )
        assert '"tools": ["list_cherrys", "list_berrys"]' in mismatch["raw"]
        first = next(c for c in kept if c["tools"] == [shop("list_apples"), shop("get_apple")])
        detail = first["provenance"]["detail"]
        assert detail["votes"] == [
            {"sensible": True, "reason": "each step uses what the one before returns"}
        ]
        assert detail["question"].startswith("Here is what I am after today: list apples")
        assert detail["predicted"] == ["list_apples", "get_apple"] and detail["offered"] == 9
        assert detail["sampled"]["stage"] == "chains"
        assert first["provenance"]["prompts"] == {
            "chain_vote": "chain_vote.v1", "tasks": "tasks.v1",
            "back_translate": "back_translate.v1",
        }  # fmt: skip
        assert (checked.checked, checked.kept, checked.kept_share) == (6, 3, 0.5)
        assert (checked.voted_out, checked.mismatched) == (2, 1)
        assert (checked.votes_yes, checked.votes_no) == (4, 2)
        assert checked.stage == "chains" and checked.check == "check-chains"
        assert checked.lengths == {2: 2, 3: 1} and checked.chains == 3
        assert checked.tokens["back_translate.v1"].calls == 4 and checked.completion_tokens > 0

        # `synth tasks` reads the checked chains as it reads `synth chains` output
        tasks = TasksConfig(chains=[check.out], pool=[pool], out=tmp_path / "tasks",
                            model={"base_url": srv.base_url, "model": MODEL},
                            modes=["diverse"], decontaminate=False)  # fmt: skip
        task_stats = await synth_tasks(tasks)
        assert task_stats.chains == 3 and task_stats.questions == 3
        assert {t["chain"] for t in read(tasks.out / "tasks.jsonl")} == {c["id"] for c in kept}


async def test_confirm_endpoint_failures_are_not_data(
    tmp_path: Path, world: tuple[Path, Path]
) -> None:
    pool, graph = world
    good = ScriptedTeacher()

    def flaky(body: dict[str, Any]) -> Reply:
        sick = "shop/list_berrys -> shop/delete_berry" in body["messages"][0]["content"]
        return Reply(status=503) if sick else good(body)

    with ScriptedServer(flaky, model=MODEL) as srv:
        cfg = confirm_cfg(graph, tmp_path / "out", srv.base_url, pool=[pool],
                          model={"max_retries": 0})  # fmt: skip
        with pytest.raises(UnitsFailed, match="1 unit"):
            await synth_confirm(cfg)
        assert not (cfg.out / "stats.json").exists()
        assert len((cfg.out / JOURNAL).read_text().splitlines()) == 2
        srv.set_script(good)
        srv.requests.clear()
        stats = await synth_confirm(cfg.model_copy(update={"resume": True}))
        assert len(srv.requests) == 1  # only the failed batch
    assert stats.resumed_units == 2 and stats.confirmed == 8 and stats.rejections == {}
    assert stats.tokens["edge_confirm.v1"].calls == 3


def test_confirm_refuses_its_input_as_output_and_a_changed_pool(
    tmp_path: Path, world: tuple[Path, Path]
) -> None:
    pool, graph = world
    with pytest.raises(ConfigError, match="is also a --graph"):
        asyncio.run(synth_confirm(confirm_cfg(graph, graph, "http://127.0.0.1:9/v1")))
    (pool / "pool.jsonl").write_text((pool / "pool.jsonl").read_text() + "\n")
    with pytest.raises(ConfigError, match="which changed since"):
        asyncio.run(synth_confirm(confirm_cfg(graph, tmp_path / "o", "http://127.0.0.1:9/v1")))


async def test_edges_of_tools_missing_from_the_pool_are_not_asked(
    tmp_path: Path, world: tuple[Path, Path], teacher_server: ScriptedServer
) -> None:
    pool, graph = world
    lines = (pool / "pool.jsonl").read_text().splitlines()
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(x + "\n" for x in lines if '"shop/get_apple"' not in x))
    teacher_server.set_script(ScriptedTeacher())
    teacher_server.requests.clear()
    cfg = confirm_cfg(graph, tmp_path / "out", teacher_server.base_url, pool=[partial], batch=8)
    stats = await synth_confirm(cfg)
    rejected = read(cfg.out / "rejections.jsonl")
    assert [(r["id"], r["reason"]) for r in rejected] == [
        ("shop/list_apples->shop/get_apple", "unknown_tool")
    ]
    assert rejected[0]["source"].endswith("edges.jsonl:2")
    asked = json.loads(EDGES_LINE.findall(teacher_server.requests[0]["messages"][0]["content"])[-1])
    assert len(teacher_server.requests) == 1 and len(asked) == 7
    assert (stats.confirmed, stats.unjudged, stats.failed_batches) == (7, 1, 0)


# ------------------------------------------------------------------ check-chains, in detail


def _tool(server: str, name: str, desc: str) -> ToolRecord:
    schema = {"type": "object", "properties": {"ref": S}, "required": ["ref"]}
    return ToolRecord(id=f"{server}/{name}", server=server, name=name, description=desc,
                      input_schema=schema)  # fmt: skip


POOL = [
    _tool("shop", "get_apple", "Get one apple."),
    _tool("shop", "weigh_apple", "Weigh the apple on the scale."),
    _tool("shop", "paint_fence", "Paint the garden fence."),
    _tool("shop", "order_plums", "Order a crate of plums."),
    _tool("depot", "get_apple", "Fetch the apple crate from the depot."),
    _tool("depot", "ship_crate", "Ship a crate to a customer."),
    _tool("twin", "find_pear", "Find one pear."),
    _tool("twin", "aa_pear", "Find one pear. The older copy."),  # the same clause: ambiguous
    _tool("twin", "peel_pear", "Peel the pear for dessert."),
]
CHAINS = {
    "c-ok": ["shop/get_apple", "shop/weigh_apple"],
    "c-cross": ["shop/get_apple", "depot/get_apple", "depot/ship_crate"],  # names collide
    "c-twin": ["twin/find_pear", "twin/peel_pear"],  # a distractor reads the same
    "c-garble": ["shop/paint_fence", "shop/weigh_apple"],  # the vote reply is unusable
    "c-noq": ["shop/order_plums", "depot/ship_crate"],  # the request reply is unusable
    "c-made-up": ["depot/ship_crate", "shop/order_plums"],  # predicts a tool not offered
    "c-unknown": ["shop/get_apple", "shop/no_such_tool"],
}


def write_chains(root: Path) -> tuple[Path, Path]:
    pool, chains = root / "pool.jsonl", root / "chains.jsonl"
    pool.write_text("".join(t.model_dump_json() + "\n" for t in POOL))
    lines = [ToolChain(id=cid, tools=tools, edges=[], scores=[], score=1.0,
                       servers=list(dict.fromkeys(t.split("/")[0] for t in tools)))
             .model_dump_json() for cid, tools in CHAINS.items()]  # fmt: skip
    chains.write_text("\n".join([*lines, lines[0]]) + "\n")  # and c-ok twice
    return chains, pool


@pytest.fixture(scope="module")
def teacher_server() -> Iterator[ScriptedServer]:
    with scripted_teacher_server(ScriptedTeacher(), MODEL) as srv:
        yield srv


async def test_check_chains_offers_the_servers_tools_and_keeps_exact_matches(
    tmp_path: Path, teacher_server: ScriptedServer
) -> None:
    chains, pool = write_chains(tmp_path)
    srv = teacher_server
    plants = ScriptedPlants(
        garble=frozenset({"paint_fence"}),
        predict={"ship a crate to a customer, and finally": ["ship_crate", "teleport_plums"]},
    )
    srv.set_script(ScriptedTeacher(plants=[Plant("order_plums", template="tasks",
                                                 output="not_json")], checks=plants))  # fmt: skip
    srv.requests.clear()
    cfg = check_cfg(chains, pool, tmp_path / "out", srv.base_url, max_offered=3, seed=5)
    stats = await synth_check_chains(cfg)
    kept = {c["id"]: c for c in read(cfg.out / "chains.jsonl")}
    rejected = {r["id"]: r for r in read(cfg.out / "rejections.jsonl")}
    assert set(kept) == {"c-ok", "c-cross"}
    assert {k: r["reason"] for k, r in rejected.items()} == {
        "c-twin": "back_translation_mismatch", "c-garble": "chain_vote:schema",
        "c-noq": "tasks:not_json", "c-made-up": "back_translation_mismatch",
        "c-unknown": "unknown_tool", "c-ok": "duplicate_chain",
    }  # fmt: skip
    assert "predicted [twin/aa_pear, twin/peel_pear]" in rejected["c-twin"]["detail"]
    made_up = rejected["c-made-up"]["detail"]
    assert made_up.startswith("predicted [depot/ship_crate, ?teleport_plums]")
    assert "(not offered: teleport_plums)" in made_up
    assert rejected["c-garble"]["raw"] == '{"sensible": "perhaps", "reason": "planted"}'
    assert rejected["c-noq"]["raw"].startswith("Sure!")
    # the cross-server chain: both get_apple offered, named apart, mapped back to pool ids
    assert kept["c-cross"]["provenance"]["detail"]["predicted"] == [
        "shop__get_apple", "depot__get_apple", "ship_crate"]  # fmt: skip
    offers = [
        {t["name"] for t in json.loads(OFFERED_LINE.findall(r["messages"][0]["content"])[-1])}
        for r in srv.requests
        if "back_translate.v1]" in r["messages"][0]["content"]
    ]
    assert {"shop__get_apple", "depot__get_apple", "ship_crate"} in offers
    assert len(offers) == 4 and all(len(o) == 3 for o in offers)  # max_offered: 3 in all
    assert {"get_apple", "weigh_apple"} < next(o for o in offers if "weigh_apple" in o)
    assert stats.checked == 7 and stats.kept == 2 and stats.mismatched == 2


async def test_k_votes_and_a_threshold(tmp_path: Path, teacher_server: ScriptedServer) -> None:
    chains, pool = write_chains(tmp_path)
    srv = teacher_server
    srv.set_script(ScriptedTeacher(checks=ScriptedPlants(vote_no=frozenset({"peel_pear"}))))
    srv.requests.clear()
    cfg = check_cfg(chains, pool, tmp_path / "out", srv.base_url, votes=3,
                    back_translate=False)  # fmt: skip
    stats = await synth_check_chains(cfg)
    assert len(srv.requests) == 3 * 6  # six chains in the pool, no back-translation
    assert stats.kept == 5 and stats.voted_out == 1 and (stats.votes_yes, stats.votes_no) == (15, 3)
    kept = read(cfg.out / "chains.jsonl")
    assert len(kept[0]["provenance"]["detail"]["votes"]) == 3
    assert kept[0]["provenance"]["prompts"] == {"chain_vote": "chain_vote.v1"}


# ------------------------------------------------------------------ the commands


def test_the_commands(
    tmp_path: Path, world: tuple[Path, Path], teacher_server: ScriptedServer
) -> None:
    runner = CliRunner()
    env = {"COLUMNS": "200"}
    for command in ("confirm", "check-chains"):
        got = runner.invoke(train_app, ["synth", command, "--help"], env=env)
        assert got.exit_code == 0 and "Example: astra-train synth" in got.output
    graph = world[1]
    teacher_server.set_script(ScriptedTeacher())
    out = tmp_path / "confirmed"
    args = ["synth", "confirm", "--graph", str(graph), "--out", str(out), "--base-url",
            teacher_server.base_url, "--model", MODEL, "--batch", "5"]  # fmt: skip
    got = runner.invoke(train_app, args, env=env)
    assert got.exit_code == 0, got.output
    assert "batches (failed)" in got.output and "2 (0)" in got.output
    assert json.loads((out / "stats.json").read_text())["params"]["batch"] == 5
    again = runner.invoke(train_app, args, env=env)
    assert again.exit_code != 0 and "pass --overwrite" in again.output


@pytest.mark.integration
def test_check_chains_kill_and_resume_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    servers = tmp_path / "servers.jsonl"
    many = [f"fruit{chr(97 + i)}" for i in range(12)]  # list_fruitas → … → list_fruitls
    servers.write_text(json.dumps(catalogue(many)[0]) + "\n")
    build_pool(PoolConfig(out=tmp_path / "pool", servers=servers))
    build_graph(GraphConfig(pool=[tmp_path / "pool"], out=tmp_path / "graph"))
    sample_chains(
        ChainConfig(graph=[tmp_path / "graph"], out=tmp_path / "chains", count=30, seed=1)
    )
    out = tmp_path / "out"
    with scripted_teacher_server(ScriptedTeacher(delay_s=0.03), MODEL) as srv:
        args = ["synth", "check-chains", "--chains", str(tmp_path / "chains"), "--pool",
                str(tmp_path / "pool"), "--out", str(out), "--base-url", srv.base_url,
                "--model", MODEL, "--concurrency", "2"]  # fmt: skip
        done = kill_stage_midway(args, out, 4, 30, torn="chain-999")
        srv.set_script(ScriptedTeacher())
        cfg = check_cfg(tmp_path / "chains", tmp_path / "pool", out, srv.base_url,
                        concurrency=2)  # fmt: skip
        stats, asked = resume_killed_stage(synth_check_chains, cfg, "chains", srv)
        assert asked == 3 * (30 - done)  # vote, request, back-translation
    kept = read(out / "chains.jsonl")
    assert sorted(c["id"] for c in kept) == sorted(
        c["id"] for c in read(tmp_path / "chains" / "chains.jsonl")
    )
    assert not read(out / "rejections.jsonl")
    assert stats.resumed_units == done and stats.kept == 30
    assert stats.tokens["chain_vote.v1"].calls == 30  # the killed run's tokens kept
