#!/usr/bin/env bash
# The browser test of the web console, from nothing: a virtualenv with
# selenium and the pinned grpcio/grpcio-tools, the server binary, the
# Python client generated from proto/, then tests/console/test_console.py,
# which starts its own servers (`letterbox serve --console-listen`) and
# drives Debian's chromium through chromedriver.
#
#   bash tests/console/run.sh
#
# Needs the Debian packages chromium and chromium-driver (.ci/run installs
# them; by hand: apt-get install chromium chromium-driver), a system Python
# 3.10+ with the venv module (PYTHON chooses it, default python3), access to
# PyPI on the first run, and cargo if the server is not built yet. Without
# the browser, that Python, or when PyPI does not answer, it skips (exit
# code 77, the skip rule of tests/common.sh). Everything goes under target/
# (never committed):
#   target/console-venv/         the virtualenv, reused while requirements.txt
#                                and the Python version are unchanged
#   target/console-client/       the generated client, regenerated every run
#   target/console-screenshots/  the screenshots (overview.png, queue.png,
#                                dlq-redrive-preview.png), emptied every run;
#                                failures/ has one per failing scenario
# The server is built (cargo build --bin letterbox) only if
# target/debug/letterbox is missing; after changing the server, build it
# again yourself, or point LETTERBOX_BIN at another binary. CHROMIUM and
# CHROMEDRIVER choose another browser and driver.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

client=target/console-client
shots=target/console-screenshots
. tests/common.sh

# 1. The browser and its driver: Debian's, not downloaded by selenium.
chromium="${CHROMIUM:-$(command -v chromium || true)}"
chromedriver="${CHROMEDRIVER:-$(command -v chromedriver || true)}"
[[ -n "$chromium" && -x "$chromium" ]] ||
  skip "chromium is not installed (on Debian: apt-get install chromium chromium-driver)"
[[ -n "$chromedriver" && -x "$chromedriver" ]] ||
  skip "chromedriver is not installed (on Debian: apt-get install chromium chromium-driver)"
log "browser: $("$chromium" --version 2>/dev/null | head -n 1); driver: $("$chromedriver" --version | head -n 1)"

# 2. The virtualenv, with the requirements.
test_venv target/console-venv tests/console/requirements.txt

# 3. The server.
test_server

# 4. The client, generated from proto/.
log "generating the Python client"
PYTHON="$py" tests/python/generate.sh "$client" >/dev/null

# 5. The test.
rm -rf "$shots"
mkdir -p "$shots"
log "running tests/console/test_console.py (screenshots in $shots)"
CHROMIUM="$chromium" CHROMEDRIVER="$chromedriver" \
  LETTERBOX_BIN="$server" LETTERBOX_PY_CLIENT="$root/$client" \
  LETTERBOX_CONSOLE_SCREENSHOTS="$root/$shots" \
  exec "$py" tests/console/test_console.py
