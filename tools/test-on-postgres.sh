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
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/letterbox-pg-suite.XXXXXX)
chmod 755 "$dir"  # PostgreSQL runs as the postgres user under root
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url=$(tools/pg-local.sh start "$dir/pg" "$port")
trap 'tools/pg-local.sh stop "$dir/pg"; rm -rf "$dir"' EXIT
LETTERBOX_TEST_PG=$url cargo test -p letterbox --test it -- "$@" \
    --skip disk_faults:: --skip verify:: --skip docs:: --skip ecosystem:: --skip ha:: \
    --skip durability::a_second_server_on_the_same_directory_is_refused \
    --skip durability::an_unknown_format_is_refused_and_nothing_is_touched \
    --skip durability::damage_to_acknowledged_log_records_is_refused_at_start \
    --skip durability::one_damaged_body_does_not_cost_its_neighbours \
    --skip durability::with_the_disk_full_publishes_fail_and_acks_work
