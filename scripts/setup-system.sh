#!/usr/bin/env bash
# System packages: bubblewrap (the sandbox for arena tool code) and chromium (the browser the
# report's test opens pages in; `astra-eval report` itself needs no browser). Installed with
# apt-get when running as root on Debian/Ubuntu; elsewhere say what to install.
set -euo pipefail
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing system packages: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
echo "system ok: $(bwrap --version), $(chromium --version 2>/dev/null | head -1)"
