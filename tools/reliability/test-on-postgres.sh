#!/usr/bin/env bash
# The integration suite against the PostgreSQL store: a throwaway
# PostgreSQL on loopback (tools/services/pg-local.sh), and every test server of
# tests/it keeping its state in a database of its own there
# (LETTERBOX_TEST_PG, `serve --store`). Left out: the tests of the local
# data directory itself (its files damaged, deleted, filled or verified
# offline), the documents, the client ecosystems (they do not touch the
# store), and the two-node tests (which start PostgreSQL themselves).
#
# Usage: tools/reliability/test-on-postgres.sh [extra test filters and flags...]
# (Run under `tools/services/pg-local.sh run`, which sets PG_LOCAL_URL: a PG_LOCAL_URL
# already set is used as the admin URL instead.)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${PG_LOCAL_URL:-}" ] || exec tools/services/pg-local.sh run tools/reliability/test-on-postgres.sh "$@"
# The tests/it binary of `cargo test --workspace` (the README's command,
# nothing to compile after it): `cargo test -p letterbox --test it` would
# resolve the root package's features alone and compile its dependencies
# a second time.
it=$(cargo test --workspace --no-run --message-format=json-render-diagnostics |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
[ -n "$it" ] || { echo "no tests/it binary built" >&2; exit 1; }
# Four at a time, as `cargo test` runs them (.cargo/config.toml).
RUST_TEST_THREADS=${RUST_TEST_THREADS:-4} LETTERBOX_TEST_PG=$PG_LOCAL_URL "$it" "$@" \
    --skip disk_faults:: --skip verify:: --skip log_damage:: --skip docs:: --skip ecosystem:: --skip ha:: \
    --skip durability::a_second_server_on_the_same_directory_is_refused \
    --skip durability::an_unknown_format_is_refused_and_nothing_is_touched \
    --skip durability::damage_to_acknowledged_log_records_is_refused_at_start \
    --skip durability::one_damaged_body_does_not_cost_its_neighbours \
    --skip durability::with_the_disk_full_publishes_fail_and_acks_work
