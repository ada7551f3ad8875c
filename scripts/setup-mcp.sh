#!/usr/bin/env bash
# Real MCP servers used by the tests and the demo, installed offline-capable from the registries.
set -euo pipefail
dir=${1:-.mcp-servers}
mkdir -p "$dir"
cd "$dir"
[ -f package.json ] || echo '{"name":"astra-mcp-servers","private":true}' > package.json
npm install --silent --no-audit --no-fund \
  @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem \
  @modelcontextprotocol/server-memory >/dev/null
echo "mcp servers ok: $(ls node_modules/@modelcontextprotocol | tr '\n' ' ')"
