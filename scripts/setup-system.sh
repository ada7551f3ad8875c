#!/usr/bin/env bash
# System packages: bubblewrap (the sandbox for arena tool code). Installed with apt-get when
# running as root on Debian/Ubuntu; elsewhere say what to install.
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  echo "system ok: $(bwrap --version)"
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  echo "system ok: $(bwrap --version)"
else
  echo "bubblewrap (bwrap) is missing: install it (e.g. sudo apt-get install bubblewrap)" >&2
  exit 1
fi
