"""Project-owned test doubles that speak real protocols over real sockets or pipes.

* :mod:`astra_agent.testing.scripted_server` — a scripted OpenAI-compatible chat server (HTTP),
  for deterministic model behaviour in tests and benchmarks. It is a fake model, named as such.
* :mod:`astra_agent.testing.mcp_fixture` — an MCP server whose tools can crash, hang, start
  slowly, fail and return huge outputs on demand.
* :mod:`astra_agent.testing.mcp_faults` — MCP servers that misbehave at the protocol level
  (remote ``$ref`` schemas, ReDoS patterns, no answer to ``initialize``, JSON-RPC error
  replies, invalid tool names, results over the size cap).
"""
