# The steps the scripted tests share, sourced (from the repository root)
# by tests/anypoint/run.sh, tests/python/run.sh, tests/buf/run.sh and
# tests/clients/run.sh: a virtualenv with pinned requirements, npm packages
# under target/, the server binary, and the skip rule. All callers run with
# `set -euo pipefail`.

log() { echo "== $*"; }

# The skip rule. A script that cannot run because something it needs is
# missing here and cannot be installed (no python3 or npm; PyPI or the npm
# registry does not answer when something must be installed) prints
# `skipped: WHY` on standard error and exits with code 77. The cargo tests
# that run these scripts then print a SKIP line and pass, unless
# LETTERBOX_REQUIRE_ECOSYSTEM=1 (.ci/run sets it), under which a skip
# fails. Anything else that fails (an install from a registry that
# answers, the test itself) is a failure.
skip() {
  echo "skipped: $*" >&2
  exit 77
}

# pypi_down PY: succeeds, printing why, if the package index that pip uses
# (PIP_INDEX_URL, pip's configuration, or pip's default) does not answer within
# 15 seconds. Any HTTP answer, even an error status, counts as answering.
pypi_down() {
  "$1" - <<'PY'
import os, subprocess, sys, urllib.error, urllib.request
from pip._internal.models.index import PyPI  # pip's default index
url = os.environ.get("PIP_INDEX_URL") or subprocess.run(
    [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
    capture_output=True, text=True,
).stdout.strip() or PyPI.simple_url
try:
    urllib.request.urlopen(url.rstrip("/") + "/pip/", timeout=15).close()
except urllib.error.HTTPError:
    sys.exit(1)
except Exception as e:
    print(f"{url}: {e}")
    sys.exit(0)
sys.exit(1)
PY
}

# npm_install PREFIX ARGS...: `npm install ARGS` in the directory PREFIX,
# or `npm ci` there when ARGS is `ci` (done again only when
# PREFIX/package-lock.json changed since the last one). Skips when node or
# npm is missing or the registry does not answer `npm ping`; an install
# from a registry that answers must succeed.
npm_install() {
  local prefix="$1"
  shift
  command -v node >/dev/null || skip "node is not installed"
  command -v npm >/dev/null || skip "npm is not installed"
  mkdir -p "$prefix"
  local cmd=(npm install --prefix "$prefix" --no-save "$@")
  local stamp="$prefix/node_modules/.ci.stamp"
  if [[ "$*" == ci ]]; then
    if [[ -f "$stamp" ]] && cmp -s "$stamp" "$prefix/package-lock.json"; then
      log "packages of $prefix/package-lock.json already installed"
      return
    fi
    cmd=(npm ci --prefix "$prefix")
  fi
  local why
  if ! why="$(npm ping --fetch-retries=0 --fetch-timeout=15000 2>&1)"; then
    why="$(printf '%s\n' "$why" | grep -m 1 FetchError ||
      printf '%s\n' "$why" | grep -m 1 'npm error code' ||
      printf '%s\n' "$why" | tail -n 1)"
    skip "the npm registry does not answer (${why#npm error })"
  fi
  "${cmd[@]}" --no-audit --no-fund --loglevel=error
  [[ "$*" == ci ]] && cp "$prefix/package-lock.json" "$stamp"
  return 0
}

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
    command -v "$system_python" >/dev/null ||
      skip "$system_python is not installed (PYTHON chooses another Python 3.10+)"
    log "creating virtualenv $venv with $("$system_python" --version 2>&1)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$system_python" -m venv "$venv" ||
      skip "$system_python cannot make a virtualenv (on Debian: apt-get install python3-venv)"
  fi
  py="$venv/bin/python"

  want_stamp="$("$py" -c 'import sys; print(sys.version)'; cat "$requirements")"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
    log "requirements already installed in $venv"
  else
    log "installing $requirements into $venv"
    rm -f "$stamp"
    local why
    if why="$(pypi_down "$py")"; then
      skip "the package index does not answer ($why)"
    fi
    "$py" -m pip install --disable-pip-version-check --no-input --quiet \
      --only-binary=:all: -r "$requirements"
    printf '%s' "$want_stamp" > "$stamp"
  fi
}

# test_server: sets server to the server binary, LETTERBOX_BIN (which must
# be an executable file) or target/debug/letterbox (under CARGO_TARGET_DIR
# when that is set), built with `cargo build --bin letterbox` only if it is
# missing.
test_server() {
  server="${LETTERBOX_BIN:-${CARGO_TARGET_DIR:-target}/debug/letterbox}"
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
