"""`astra-train synth pool|graph|chains`: the tool pool, the tool graph, the chains."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent.errors import ConfigError
from training.cli import app as train_app
from training.synth.cli import synth_app
from training.synth.stage import JOURNAL, SynthError
from training.synth.tools import (
    ChainConfig,
    EdgeQuestion,
    GraphConfig,
    PoolConfig,
    ToolEdge,
    ToolRecord,
    Verdict,
    build_graph,
    build_pool,
    confirm_edges,
    propose_edges,
    sample_chains,
)

REPO = Path(__file__).resolve().parents[2]
NODE_BIN = REPO / ".mcp-servers" / "node_modules" / ".bin"
S = {"type": "string"}


def tool(
    name: str, desc: str, props: dict[str, Any], required: Sequence[str] = (), **extra: Any
) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "required": list(required)}
    return {"name": name, "description": desc, "inputSchema": schema, **extra}


# Two travel servers and a weather one (one domain), a finance one, a Chinese one; in the
# three shapes the pool reads (ASTRA's base_info, the same under mcp_info, flat).
TRAVEL = [
    {
        "base_info": {
            "group_info": {"server_name": "flights", "domain": "travel"},
            "tool_list": [
                tool(
                    "search_flights",
                    "Search flights between two cities. Returns flights with their "
                    "flight_id, price and arrival city.",
                    {"origin": S, "destination": S, "date": S},
                    ["origin", "destination", "date"],
                ),
                tool(
                    "book_flight",
                    "Book a seat on a flight. Returns the booking with its booking_id.",
                    {
                        "flight_id": {"type": "string", "description": "The flight to book"},
                        "passenger_name": S,
                    },
                    ["flight_id", "passenger_name"],
                ),
                tool(
                    "get_booking",
                    "Get a booking's details: the flight, the passenger and the status.",
                    {"booking_id": {"type": "string", "description": "The booking's id"}},
                    ["booking_id"],
                ),
                tool(
                    "cancel_booking",
                    "Cancel a booking.",
                    {"booking_id": S, "reason": S},
                    ["booking_id"],
                ),
            ],
        }
    },
    {
        "mcp_info": {
            "base_info": {
                "group_info": {"server_title": "hotels", "domain": "travel"},
                "tool_list": [
                    tool(
                        "search_hotels",
                        "Search hotels in a city. Returns hotels with hotel_id and price.",
                        {"city": S, "check_in": S, "nights": {"type": "integer"}},
                        ["city", "check_in"],
                    ),
                    {
                        "type": "function",
                        "function": {
                            "name": "book_hotel",
                            "description": "Book a room.",
                            "parameters": {
                                "type": "object",
                                "properties": {"hotel_id": S, "guest_name": S},
                                "required": ["hotel_id", "guest_name"],
                            },
                        },
                    },
                ],
            }
        }
    },
    {
        "name": "weather",
        "domain": "travel",
        "tools": [
            tool(
                "get_forecast",
                "Returns the weather forecast: temperature and conditions.",
                {"city": S, "date": S},
                ["city"],
            ),
            tool("ping", "Check that the service is up.", {}),
        ],
    },
    {
        "server_name": "fx",
        "category": "finance",
        "tools": [
            tool(
                "get_exchange_rate",
                "Exchange rate between two currencies.",
                {"base": S, "quote": S},
                ["base", "quote"],
                outputSchema={"type": "object", "properties": {"rate": {"type": "number"}}},
            ),
            tool(
                "convert_amount",
                "Convert an amount at a rate.",
                {"amount": {"type": "number"}, "rate": {"type": "number"}},
                ["amount", "rate"],
            ),
        ],
    },
    {
        "name": "天气",
        "domain": "生活",
        "tools": [
            tool(
                "城市列表",
                "列出城市",
                {},
                outputSchema={"type": "object", "properties": {"城市": S}},
            ),
            tool("天气预报", "查询天气", {"城市": S}, ["城市"]),
        ],
    },
]
TRAVEL_EDGES = {  # (source, target, parameter, rule of the best match)
    ("flights/search_flights", "flights/book_flight", "flight_id", "key"),
    ("flights/book_flight", "flights/get_booking", "booking_id", "key"),
    ("flights/book_flight", "flights/cancel_booking", "booking_id", "key"),
    ("hotels/search_hotels", "hotels/book_hotel", "hotel_id", "key"),
    ("flights/search_flights", "hotels/search_hotels", "city", "tokens"),  # across servers
    ("flights/search_flights", "weather/get_forecast", "city", "tokens"),
    ("fx/get_exchange_rate", "fx/convert_amount", "rate", "field"),
    ("天气/城市列表", "天气/天气预报", "城市", "field"),
}


def chain_servers(entities: Sequence[str]) -> list[dict[str, Any]]:
    """A catalogue whose listings hang together: ``list_<e>`` takes the previous entity's id,
    ``get_<e>`` / ``delete_<e>`` take ``<e>_id``."""
    tools = []
    for prev, e in zip([None, *entities], entities, strict=False):
        props = {f"{prev}_id": S} if prev else {}
        tools.append(tool(f"list_{e}s", f"List {e}s.", props, list(props)))
        tools.append(tool(f"get_{e}", f"Get one {e}.", {f"{e}_id": S}, [f"{e}_id"]))
        tools.append(tool(f"delete_{e}", f"Delete one {e}.", {f"{e}_id": S}, [f"{e}_id"]))
    return [{"name": "shop", "domain": "shop", "tools": tools}]


def write_jsonl(path: Path, rows: Sequence[Any], tail: str = "") -> Path:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text + tail, encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def graph_of(tmp: Path, servers: Sequence[Any], name: str = "g") -> Path:
    src = write_jsonl(tmp / f"{name}.jsonl", servers)
    build_pool(PoolConfig(out=tmp / f"{name}-pool", servers=src))
    build_graph(GraphConfig(pool=[tmp / f"{name}-pool"], out=tmp / f"{name}-graph"))
    return tmp / f"{name}-graph"


def edge_set(graph: Path) -> set[tuple[str, str, str, str]]:
    out = set()
    for e in read_jsonl(graph / "edges.jsonl"):
        best = e["matches"][0]
        out.add((e["source"], e["target"], best["param"], best["rule"]))
    return out


# ------------------------------------------------------------------ pool


def test_pool_reads_every_shape_and_names_what_it_rejects(tmp_path: Path) -> None:
    bad = [
        ["not", "an", "object"],
        {"description": "no name"},
        {"name": "empty"},
        {
            "name": "broken",
            "tools": [
                {"description": "no name"},
                tool("ok", "fine", {"x": S}),
                {"name": "stringly", "inputSchema": "a string"},
                {"name": "listy", "inputSchema": {"type": "object", "properties": ["x"]}},
                tool("ok", "twice", {}),
            ],
        },
    ]
    src = write_jsonl(tmp_path / "servers.jsonl", TRAVEL + bad, tail="{not json\n")
    stats = build_pool(PoolConfig(out=tmp_path / "pool", servers=src))
    records = [ToolRecord.model_validate(r) for r in read_jsonl(tmp_path / "pool" / "pool.jsonl")]
    ids = [r.id for r in records]
    assert ids[:2] == ["flights/search_flights", "flights/book_flight"]
    assert {"hotels/book_hotel", "天气/城市列表", "broken/ok"} <= set(ids)
    assert len(ids) == len(set(ids)) == stats.tools == 13
    hotel = next(r for r in records if r.id == "hotels/book_hotel")  # OpenAI wrapper, mcp_info
    assert hotel.domain == "travel" and hotel.input_schema["required"] == ["hotel_id", "guest_name"]
    rate = next(r for r in records if r.id == "fx/get_exchange_rate")
    assert rate.domain == "finance" and rate.output_schema is not None
    assert rate.provenance is not None and rate.provenance.run == stats.fingerprint
    assert rate.provenance.inputs == [f"{src}:4"] and "+synth." in rate.provenance.code_version
    rejected = read_jsonl(tmp_path / "pool" / "rejections.jsonl")
    got = {(r["reason"], r["id"], r["source"].rsplit(":", 1)[1]) for r in rejected}
    assert got == {
        ("not_a_server", "", "6"),
        ("no_server_name", "", "7"),
        ("no_tools", "empty", "8"),
        ("no_tool_name", "broken", "9"),
        ("bad_input_schema", "broken/stringly", "9"),
        ("bad_input_schema", "broken/listy", "9"),
        ("duplicate_tool", "broken/ok", "9"),
        ("not_json", "", "10"),
    }
    assert stats.rejections["bad_input_schema"] == 2
    assert stats.by_domain == {"": 1, "finance": 2, "travel": 8, "生活": 2}


def test_pool_resumes_after_an_interrupt_and_refuses_to_overwrite(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "servers.jsonl", TRAVEL)
    fresh = tmp_path / "fresh"
    build_pool(PoolConfig(out=fresh, servers=src))

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    out = tmp_path / "out"
    cfg = PoolConfig(out=out, servers=src)
    with pytest.raises(KeyboardInterrupt):
        build_pool(cfg, progress=stop_after_two)
    assert not (out / "pool.jsonl").exists() and (out / JOURNAL).is_file()
    with (out / JOURNAL).open("a") as f:
        f.write('{"unit": "weather", "records": [{"id"')  # a writer killed mid-line
    with pytest.raises(ConfigError, match="unfinished pool run"):
        build_pool(cfg)
    resume = cfg.model_copy(update={"resume": True})
    stats = build_pool(resume)
    assert stats.resumed_units == 2 and stats.tools == 12
    assert (out / "pool.jsonl").read_bytes() == (fresh / "pool.jsonl").read_bytes()
    assert not (out / JOURNAL).exists()
    with pytest.raises(ConfigError, match="complete pool run"):
        build_pool(cfg)
    assert build_pool(resume).finished == stats.finished  # nothing to do
    with pytest.raises(ConfigError, match="other inputs or parameters"):
        build_pool(PoolConfig(out=out, servers=src, resume=True, shard="0/2"))
    assert build_pool(cfg.model_copy(update={"overwrite": True})).resumed_units == 0


def test_shards_of_the_pool_and_the_graph_add_up(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "servers.jsonl", TRAVEL)
    whole = graph_of(tmp_path, TRAVEL, "whole")
    pools = []
    for i in range(2):
        build_pool(PoolConfig(out=tmp_path / f"p{i}", servers=src, shard=f"{i}/2"))
        pools.append(tmp_path / f"p{i}")
    ids = [r["id"] for p in pools for r in read_jsonl(p / "pool.jsonl")]
    assert sorted(ids) == sorted(r["id"] for r in read_jsonl(tmp_path / "whole-pool/pool.jsonl"))
    graphs = []
    for i in range(3):
        build_graph(GraphConfig(pool=pools, out=tmp_path / f"g{i}", shard=f"{i}/3"))
        graphs.append(tmp_path / f"g{i}")
    assert set().union(*(edge_set(g) for g in graphs)) == edge_set(whole)
    merged = sample_chains(ChainConfig(graph=graphs, out=tmp_path / "c", count=50))
    assert merged.possible == 11 and merged.chains == 11


# ------------------------------------------------------------------ graph


def test_graph_proposes_exactly_the_expected_edges(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, TRAVEL)
    assert edge_set(graph) == TRAVEL_EDGES
    edges = {e["id"]: e for e in read_jsonl(graph / "edges.jsonl")}
    e = edges["flights/search_flights->flights/book_flight"]
    assert e["score"] == 1.0 and e["same_server"] and e["domain"] == "travel"
    assert (
        e["reason"] == "book_flight.flight_id ← search_flights (key: its search yields flight keys)"
    )
    assert e["provenance"]["inputs"] == ["flights/search_flights", "flights/book_flight"]
    assert not edges["flights/search_flights->hotels/search_hotels"]["same_server"]
    stats = json.loads((graph / "stats.json").read_text())
    assert stats["edges"] == 8 and stats["cross_server"] == 2
    assert stats["isolated"] == ["weather/ping"]
    nodes = {n["id"]: n for n in read_jsonl(graph / "nodes.jsonl")}
    assert nodes["flights/search_flights"]["out_degree"] == 3
    assert nodes["flights/book_flight"]["in_degree"] == 1


def test_graph_checks_types_and_needs_a_shared_domain() -> None:
    def rec(sid: str, domain: str, out_type: str) -> list[ToolRecord]:
        rate = {"type": "object", "properties": {"rate": {"type": out_type}}}
        take = {"type": "object", "properties": {"rate": {"type": "number"}}, "required": ["rate"]}
        return [
            ToolRecord(
                id=f"{sid}/get_rate", server=sid, name="get_rate", domain=domain, output_schema=rate
            ),
            ToolRecord(
                id=f"{sid}/convert", server=sid, name="convert", domain=domain, input_schema=take
            ),
        ]

    assert [e.id for e in propose_edges(rec("a", "fx", "integer"))] == ["a/get_rate->a/convert"]
    assert propose_edges(rec("a", "fx", "boolean")) == []  # a boolean is not a rate
    apart = [rec("a", "fx", "number")[0], rec("b", "other", "number")[1]]
    assert propose_edges(apart) == []
    assert [e.id for e in propose_edges(apart, across_domains=True)] == ["a/get_rate->b/convert"]


def test_graph_rejects_what_it_cannot_read_and_goes_on(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "servers.jsonl", TRAVEL)
    pool = tmp_path / "pool"
    build_pool(PoolConfig(out=pool, servers=src))
    first = read_jsonl(pool / "pool.jsonl")[0]
    listy = {**first, "id": "x/listy", "input_schema": {"properties": ["a", "b"]}}
    nested = {
        **first,
        "id": "x/nested",
        "input_schema": {"properties": {"q": {"type": "object", "properties": 3}}},
    }
    with (pool / "pool.jsonl").open("a", encoding="utf-8") as f:
        f.write("this is not json\n")
        f.write(json.dumps({"server": "x", "name": "no id"}) + "\n")
        f.write(json.dumps(listy) + "\n" + json.dumps(nested) + "\n" + json.dumps(first) + "\n")
    stats = build_graph(GraphConfig(pool=[pool], out=tmp_path / "graph"))
    rejected = {(r["reason"], r["id"]) for r in read_jsonl(tmp_path / "graph/rejections.jsonl")}
    assert rejected == {
        ("not_json", ""),
        ("bad_record", ""),
        ("bad_schema", "x/listy"),
        ("bad_schema", "x/nested"),
        ("duplicate_tool", "flights/search_flights"),
    }
    assert stats.rejections == {
        "bad_record": 1,
        "bad_schema": 2,
        "duplicate_tool": 1,
        "not_json": 1,
    }
    assert edge_set(tmp_path / "graph") == TRAVEL_EDGES


# ------------------------------------------------------------------ the judge


def test_confirm_edges_asks_a_judge_in_batches(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, TRAVEL)
    edges = [ToolEdge.model_validate(e) for e in read_jsonl(graph / "edges.jsonl")]
    tools = {
        t["id"]: ToolRecord.model_validate(t)
        for t in read_jsonl(tmp_path / "g-pool" / "pool.jsonl")
    }
    seen: list[int] = []

    def by_rule(batch: Sequence[EdgeQuestion]) -> list[Verdict]:
        seen.append(len(batch))
        assert all(q.source.id == q.edge.source and q.target.id == q.edge.target for q in batch)
        return [
            Verdict(q.edge.matches[0].rule == "key", f"rule {q.edge.matches[0].rule}")
            for q in batch
        ]

    got = asyncio.run(confirm_edges(edges, tools, by_rule, batch_size=3))
    assert seen == [3, 3, 2]
    assert {e.id for e in got.confirmed} == {e.id for e in edges if e.matches[0].rule == "key"}
    assert all(e.confirmed and e.judge_reason == "rule key" for e in got.confirmed)
    assert {r.reason for r in got.rejected} == {"judge_no"} and len(got.rejected) == 4
    assert {r.detail for r in got.rejected} == {"rule tokens", "rule field"}

    async def picky(batch: Sequence[EdgeQuestion]) -> list[Verdict]:
        await asyncio.sleep(0)
        if any("fx/" in q.edge.id for q in batch):
            return []  # a reply that lost its verdicts
        if any("天气" in q.edge.id for q in batch):
            raise RuntimeError("the endpoint went away")
        return [Verdict(True, "fine") for _ in batch]

    got = asyncio.run(confirm_edges(edges, tools, picky, batch_size=1))
    failed = {r.id: r.detail for r in got.rejected}
    assert set(failed) == {
        "fx/get_exchange_rate->fx/convert_amount",
        "天气/城市列表->天气/天气预报",
    }
    assert "0 verdict(s) for 1 edge(s)" in failed["fx/get_exchange_rate->fx/convert_amount"]
    assert "RuntimeError: the endpoint went away" in failed["天气/城市列表->天气/天气预报"]
    assert len(got.confirmed) == 6 and {r.reason for r in got.rejected} == {"judge_failed"}


# ------------------------------------------------------------------ chains


def test_chains_follow_edges_cover_every_linked_tool_and_never_repeat(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, chain_servers(["apple", "berry", "cherry", "grape", "lemon"]))
    edges = {e["id"]: e["score"] for e in read_jsonl(graph / "edges.jsonl")}
    stats = sample_chains(ChainConfig(graph=[graph], out=tmp_path / "c", count=12, seed=3))
    chains = read_jsonl(tmp_path / "c" / "chains.jsonl")
    assert len(chains) == stats.chains == 12
    assert len({tuple(c["tools"]) for c in chains}) == 12
    for c in chains:
        assert 2 <= len(c["tools"]) <= 5 and len(set(c["tools"])) == len(c["tools"])
        pairs = [f"{a}->{b}" for a, b in zip(c["tools"], c["tools"][1:], strict=False)]
        assert c["edges"] == pairs == c["provenance"]["inputs"]
        assert c["scores"] == [edges[p] for p in pairs]
        assert c["servers"] == ["shop"] and c["provenance"]["detail"]["seed"] == 3
    covered = {t for c in chains for t in c["tools"]}
    assert covered == {n["id"] for n in read_jsonl(graph / "nodes.jsonl")}  # all 15 tools
    assert stats.covered == 15 and stats.not_covered == [] and stats.no_edge == []
    assert sum(stats.lengths.values()) == 12


def test_chains_are_seeded(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, chain_servers(["apple", "berry", "cherry", "grape", "lemon"]))
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        sample_chains(ChainConfig(graph=[graph], out=tmp_path / name, count=20, seed=seed))
        runs[name] = (tmp_path / name / "chains.jsonl").read_text()
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


def test_chains_give_all_a_small_graph_has(tmp_path: Path) -> None:
    graph = graph_of(tmp_path, TRAVEL)
    stats = sample_chains(ChainConfig(graph=[graph], out=tmp_path / "c", count=50, seed=0))
    chains = [tuple(c["tools"]) for c in read_jsonl(tmp_path / "c" / "chains.jsonl")]
    assert stats.chains == stats.possible == len(set(chains)) == 11 and stats.requested == 50
    assert stats.lengths == {2: 8, 3: 3}
    assert stats.no_edge == ["weather/ping"] and stats.not_covered == []
    small = sample_chains(ChainConfig(graph=[graph], out=tmp_path / "c1", count=1, seed=0))
    assert small.chains == 1 and small.possible is None and len(small.not_covered) > 0


@pytest.mark.parametrize("where", ["walks", "enumeration"])
def test_chains_resume_gives_what_an_uninterrupted_run_gives(tmp_path: Path, where: str) -> None:
    if where == "walks":
        graph = graph_of(tmp_path, chain_servers(["apple", "berry", "cherry", "grape", "lemon"]))
        options, stop_at = {"count": 15, "seed": 5}, 6
    else:  # the travel graph's last 2 of its 11 chains come from the enumeration
        graph, options, stop_at = graph_of(tmp_path, TRAVEL), {"count": 50}, 10
    fresh = sample_chains(ChainConfig(graph=[graph], out=tmp_path / "fresh", **options))

    def stop(done: int, total: int) -> None:
        if done == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sample_chains(ChainConfig(graph=[graph], out=tmp_path / "out", **options), progress=stop)
    stats = sample_chains(ChainConfig(graph=[graph], out=tmp_path / "out", resume=True, **options))
    assert stats.resumed_units == stop_at and stats.chains == fresh.chains
    assert stats.from_enumeration == fresh.from_enumeration == (2 if where != "walks" else 0)
    want = (tmp_path / "fresh" / "chains.jsonl").read_text()
    assert (tmp_path / "out" / "chains.jsonl").read_text() == want


def test_chains_need_an_edge(tmp_path: Path) -> None:
    lonely = [{"name": "s", "tools": [tool("ping", "Ping.", {}), tool("pong", "Pong.", {})]}]
    graph = graph_of(tmp_path, lonely)
    with pytest.raises(SynthError, match="no edge"):
        sample_chains(ChainConfig(graph=[graph], out=tmp_path / "c"))
    with pytest.raises(ConfigError, match="holds a pool run, not a graph run"):
        sample_chains(ChainConfig(graph=[tmp_path / "g-pool"], out=tmp_path / "c"))


# ------------------------------------------------------------------ live servers, the CLI


@pytest.mark.integration
def test_pool_from_real_mcp_servers_skips_the_one_that_fails(tmp_path: Path) -> None:
    memory = NODE_BIN / "mcp-server-memory"
    assert memory.exists(), f"{memory} missing: run `make setup-mcp`"
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "mcp-server-time"},
                    "memory": {
                        "command": str(memory),
                        "env": {"MEMORY_FILE_PATH": str(tmp_path / "m.json")},
                    },
                    "broken": {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]},
                }
            }
        )
    )
    stats = build_pool(PoolConfig(out=tmp_path / "pool", mcp_config=config, domain="desk"))
    assert stats.servers == 3 and list(stats.servers_failed) == ["broken"]
    assert "broken" in stats.servers_failed["broken"]
    records = {r["id"]: r for r in read_jsonl(tmp_path / "pool" / "pool.jsonl")}
    assert {"time/get_current_time", "time/convert_time", "memory/search_nodes"} <= set(records)
    assert records["time/get_current_time"]["output_schema"]["properties"]["timezone"]
    assert {r["domain"] for r in records.values()} == {"desk"}
    assert stats.by_server["time"] == 2 and stats.by_server["memory"] >= 9
    (rejected,) = read_jsonl(tmp_path / "pool" / "rejections.jsonl")
    assert rejected["reason"] == "server_failed" and rejected["id"] == "broken"
    build_graph(GraphConfig(pool=[tmp_path / "pool"], out=tmp_path / "graph"))
    edges = {e["id"]: e for e in read_jsonl(tmp_path / "graph" / "edges.jsonl")}
    assert edges["time/get_current_time->time/convert_time"]["matches"][0]["param"] == (
        "source_timezone"
    )
    assert edges["memory/search_nodes->memory/open_nodes"]["matches"][0]["rule"] == "key"


def test_cli_runs_the_stages_with_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    src = write_jsonl(tmp_path / "servers.jsonl", TRAVEL)
    env = {"COLUMNS": "200"}
    pool = ["pool", "--servers", str(src), "--out", str(tmp_path / "pool")]
    res = runner.invoke(synth_app, pool, env=env)
    assert res.exit_code == 0, res.output
    assert "tools" in res.output and "12" in res.output
    res = runner.invoke(synth_app, pool, env=env)
    assert res.exit_code == 2 and "holds a complete pool run" in res.output
    assert "--overwrite" in res.output
    assert runner.invoke(synth_app, [*pool, "--overwrite"], env=env).exit_code == 0
    assert runner.invoke(synth_app, [*pool, "--resume"], env=env).exit_code == 0
    both = [*pool, "--mcp-config", str(src)]
    res = runner.invoke(synth_app, both, env=env)
    assert res.exit_code == 2 and "either --mcp-config or --servers" in res.output
    res = runner.invoke(synth_app, [*pool, "--overwrite", "--shard", "3/2"], env=env)
    assert res.exit_code == 2 and "--shard" in res.output
    graph = ["graph", "--pool", str(tmp_path / "pool"), "--out", str(tmp_path / "graph")]
    res = runner.invoke(synth_app, graph, env=env)
    assert res.exit_code == 0 and "edges" in res.output, res.output
    res = runner.invoke(
        synth_app,
        [
            "chains",
            "--graph",
            str(tmp_path / "graph"),
            "--count",
            "5",
            "--seed",
            "1",
            "--out",
            str(tmp_path / "chains"),
        ],
        env=env,
    )
    assert res.exit_code == 0 and "5 of 5 asked" in res.output, res.output
    res = runner.invoke(
        synth_app,
        ["chains", "--graph", str(tmp_path / "pool"), "--out", str(tmp_path / "c2")],
        env=env,
    )
    assert res.exit_code == 2 and "not a graph run" in res.output
    res = runner.invoke(
        synth_app,
        [
            "chains",
            "--graph",
            str(tmp_path / "graph"),
            "--out",
            str(tmp_path / "c3"),
            "--min-length",
            "4",
            "--max-length",
            "3",
        ],
        env=env,
    )
    assert res.exit_code == 2 and "min_length is larger" in res.output
    empty = write_jsonl(tmp_path / "empty.jsonl", [], tail="garbage\n")
    res = runner.invoke(synth_app, ["pool", "--servers", str(empty), "--out", str(tmp_path / "e")])
    assert res.exit_code == 1 and "no tool in the pool" in res.output
    for cmd in ("pool", "graph", "chains"):
        res = runner.invoke(train_app, ["synth", cmd, "--help"], env=env)
        assert res.exit_code == 0 and f"Example: astra-train synth {cmd}" in res.output
