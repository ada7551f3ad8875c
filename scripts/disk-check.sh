#!/usr/bin/env bash
# Before the suite: the free space where it writes (TMPDIR, default /tmp). The suite wrote
# 4.3 GB there at its peak (12-07, a fresh clone; mostly the real 135M model's SFT and RL
# runs while they train; every test's directory is removed once it passes, the base directory
# when the session passes); with less free, tests fail with "No space left on device" far from
# the cause, so say it first.
set -euo pipefail
NEED_GB=${NEED_GB:-5}
dir=${TMPDIR:-/tmp}
free_kb=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
free_gb=$((free_kb / 1024 / 1024))
echo "disk: ${free_gb} GB free in $dir (the suite writes up to about ${NEED_GB} GB there)"
if [ "$free_gb" -lt "$NEED_GB" ]; then
  echo "disk: not enough space for the suite in $dir: free some, or point TMPDIR at a disk" \
    "with ${NEED_GB} GB free" >&2
  exit 1
fi
