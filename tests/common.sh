# The steps the Python-driven tests share, sourced (from the repository
# root) by tests/anypoint/run.sh and tests/python/run.sh: a virtualenv with
# pinned requirements, and the server binary. Both callers run with
# `set -euo pipefail`.

log() { echo "== $*"; }

# test_venv VENV REQUIREMENTS: sets py to the interpreter of the virtualenv
# VENV, with the requirements file REQUIREMENTS installed in it.
#
# The virtualenv is made with PYTHON (default python3), and made again if
# its interpreter no longer runs (for example after the system Python was
# upgraded). The requirements are installed when REQUIREMENTS or the
# interpreter changed since the last successful install (recorded in
# VENV/.requirements.stamp). Wheels only: nothing is compiled, and a
# platform without wheels fails at once.
test_venv() {
  local venv="$1" requirements="$2"
  local system_python="${PYTHON:-python3}"
  local stamp="$venv/.requirements.stamp"
  local want_stamp
  if ! "$venv/bin/python" -c '' 2>/dev/null; then
    log "creating virtualenv $venv with $("$system_python" --version 2>&1)"
    rm -rf "$venv"
    mkdir -p target
    "$system_python" -m venv "$venv"
  fi
  py="$venv/bin/python"

  want_stamp="$("$py" -c 'import sys; print(sys.version)'; cat "$requirements")"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
    log "requirements already installed in $venv"
  else
    log "installing $requirements into $venv"
    rm -f "$stamp"
    "$py" -m pip install --disable-pip-version-check --no-input --quiet \
      --only-binary=:all: -r "$requirements"
    printf '%s' "$want_stamp" > "$stamp"
  fi
}

# test_server: sets server to the server binary, LETTERBOX_BIN (which must
# be an executable file) or target/debug/letterbox, built with
# `cargo build --bin letterbox` only if it is missing.
test_server() {
  server="${LETTERBOX_BIN:-target/debug/letterbox}"
  if [[ -x "$server" ]]; then
    log "server binary $server exists (not rebuilt)"
  elif [[ -n "${LETTERBOX_BIN:-}" ]]; then
    echo "LETTERBOX_BIN=$LETTERBOX_BIN is not an executable file" >&2
    exit 1
  else
    log "building the server: cargo build --bin letterbox"
    cargo build --bin letterbox
  fi
}
