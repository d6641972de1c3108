# Shared by the setup scripts of the benchmark venvs kept apart from the project's
# (setup_peers.sh, setup_reverb.sh, setup_pearl.sh, setup_tf_agents.sh): sourced, not
# run, after the script has set TOOL (its name in messages), ROOT, VENV and PYTHON. It
# defines the messages, the quiet pip, the refusal to touch another venv and the venv's
# creation (or reuse), which leaves its interpreter in PY.

log() { echo "$TOOL: $*" >&2; }
die() { echo "$TOOL: ERROR: $*" >&2; exit 1; }
trap 'echo "$TOOL: ERROR: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

# pip prints a warning for every configured index folder that lacks a package; drop
# those lines only (pip's own exit status still decides, through pipefail).
quiet_pip() {
  "$PY" -m pip --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" || true; }
}

# The installed version of a distribution in the venv (fails when it is not installed).
installed() { "$PY" -c "from importlib.metadata import version; print(version('$1'))" 2>/dev/null; }

# refuse_venvs DIR...: stop before installing into one of the project's other venvs.
refuse_venvs() {
  local other
  for other in "$@"; do
    [[ "$(realpath -m "$VENV")" != "$(realpath -m "$other")" ]] \
      || die "refusing to install into $other"
  done
}

# make_venv: the virtualenv, created once; its interpreter in PY.
make_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
}
