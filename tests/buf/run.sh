#!/usr/bin/env bash
# Lints and format-checks proto/ with buf, configured by buf.yaml at the
# repository root (lint: STANDARD + COMMENTS; breaking: FILE).
#
#   bash tests/buf/run.sh
#
# Needs Node/npm and access to the npm registry on the first run: buf is
# installed from the npm package @bufbuild/buf (a pinned version) under
# target/buf/ (never committed), and reused while the version matches.
# Without npm, or when the registry does not answer, it skips (exit code
# 77, the skip rule of tests/common.sh).
# When a release tag v* exists, also checks for breaking changes against
# the newest one; with BUF_AGAINST set, against that input instead (for
# example BUF_AGAINST='.git#tag=v1.2.0').
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

BUF_VERSION=1.75.0
prefix=target/buf
buf="$prefix/node_modules/.bin/buf"

. tests/common.sh

if [[ -x "$buf" && "$("$buf" --version 2>/dev/null)" == "$BUF_VERSION" ]]; then
  log "buf $BUF_VERSION already installed in $prefix"
else
  log "installing @bufbuild/buf@$BUF_VERSION into $prefix"
  npm_install "$prefix" "@bufbuild/buf@$BUF_VERSION"
  got="$("$buf" --version)"
  if [[ "$got" != "$BUF_VERSION" ]]; then
    echo "installed buf reports version $got, expected $BUF_VERSION" >&2
    exit 1
  fi
fi

status=0
log "buf lint"
if "$buf" lint; then echo "lint: ok"; else status=1; fi

log "buf format --diff --exit-code"
if "$buf" format --diff --exit-code; then echo "format: ok"; else status=1; fi

against="${BUF_AGAINST:-}"
if [[ -z "$against" ]]; then
  tag="$(git tag --list 'v*' --sort=-version:refname 2>/dev/null | head -n 1 || true)"
  [[ -n "$tag" ]] && against=".git#tag=$tag"
fi
if [[ -n "$against" ]]; then
  log "buf breaking --against '$against'"
  if "$buf" breaking --against "$against"; then echo "breaking: ok"; else status=1; fi
else
  log "buf breaking: skipped (no release tag v* yet)"
fi

exit "$status"
