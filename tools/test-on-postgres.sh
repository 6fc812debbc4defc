#!/usr/bin/env bash
# The integration suite against the PostgreSQL store: a throwaway
# PostgreSQL on loopback (tools/pg-local.sh), and every test server of
# tests/it keeping its state in a database of its own there
# (LETTERBOX_TEST_PG, `serve --store`). Left out: the tests of the local
# data directory itself (its files damaged, deleted, filled or verified
# offline), the documents, the client ecosystems (they do not touch the
# store), and the two-node tests (which start PostgreSQL themselves).
#
# Usage: tools/test-on-postgres.sh [extra cargo test filters...]
# (Run under `tools/pg-local.sh run`, which sets PG_LOCAL_URL: a PG_LOCAL_URL
# already set is used as the admin URL instead.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PG_LOCAL_URL:-}" ] || exec tools/pg-local.sh run tools/test-on-postgres.sh "$@"
LETTERBOX_TEST_PG=$PG_LOCAL_URL cargo test -p letterbox --test it -- "$@" \
    --skip disk_faults:: --skip verify:: --skip docs:: --skip ecosystem:: --skip ha:: \
    --skip durability::a_second_server_on_the_same_directory_is_refused \
    --skip durability::an_unknown_format_is_refused_and_nothing_is_touched \
    --skip durability::damage_to_acknowledged_log_records_is_refused_at_start \
    --skip durability::one_damaged_body_does_not_cost_its_neighbours \
    --skip durability::with_the_disk_full_publishes_fail_and_acks_work
