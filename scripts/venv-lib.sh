# Sourced by the setup scripts: `make_venv DIR` creates DIR if needed (with $PYTHON) and
# defines `pip`, which installs into it quietly. pip --quiet still warns about empty local
# index folders on some machines: that warning is filtered out.
make_venv() {
  venv=$1
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
}
pip() { "$venv/bin/python" -m pip "$@" --quiet --disable-pip-version-check 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"; }
