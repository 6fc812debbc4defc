#!/usr/bin/env bash
# One throwaway PostgreSQL on loopback, for running Letterbox's suite
# against its PostgreSQL store (Debian's `postgresql` package). PostgreSQL
# refuses to run as root: under root it runs as the `postgres` user.
#
# Usage:
#   tools/services/pg-local.sh start DIR [PORT]  initdb in DIR, start on 127.0.0.1:PORT
#                                       (default 5439), print the admin URL
#   tools/services/pg-local.sh url DIR           the admin URL again
#   tools/services/pg-local.sh stop DIR          stop it (immediate)
#   tools/services/pg-local.sh up DIR            start it again after a stop, on
#                                       the same port, with its data (crash
#                                       recovery after an immediate stop)
#   tools/services/pg-local.sh run CMD [ARGS...] start one in a new temporary
#                                       directory on a free port, run CMD
#                                       with its admin URL in PG_LOCAL_URL,
#                                       then stop it and remove the
#                                       directory (whatever CMD did); exits
#                                       with CMD's status
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../lib.sh"
. "$here/pg-common.sh"

cmd=${1:?usage: $0 start|url|stop DIR [PORT] | run CMD [ARGS...]}
if [ "$cmd" = run ]; then
    shift
    [ $# -gt 0 ] || { echo "usage: $0 run CMD [ARGS...]" >&2; exit 2; }
    tmp=$(mktemp -d /tmp/letterbox-pg.XXXXXX)
    chmod 755 "$tmp"  # PostgreSQL runs as the postgres user under root
    port=$(free_port)
    trap '"$here/pg-local.sh" stop "$tmp/pg"; rm -rf "$tmp"' EXIT
    PG_LOCAL_URL=$("$here/pg-local.sh" start "$tmp/pg" "$port")
    PG_LOCAL_DIR=$tmp/pg
    export PG_LOCAL_URL PG_LOCAL_DIR
    "$@"
    exit
fi
dir=${2:?give a scratch directory}

pg_start() { # dir port
    as_pg "$(pg_bin)/pg_ctl" -D "$1/data" -l "$1/log" -w \
        -o "-p $2 -k $1 -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200" start > /dev/null
}

case "$cmd" in
start)
    port=${3:-5439}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_pg "$(pg_bin)/initdb" -D "$dir/data" -A trust -U postgres --no-sync > "$dir/initdb.log"
    pg_start "$dir" "$port"
    echo "postgres://postgres@127.0.0.1:$port/postgres" | tee "$dir/url"
    ;;
up)
    dir=$(cd "$dir" && pwd)
    url=$(cat "$dir/url")
    port=${url##*:}
    pg_start "$dir" "${port%%/*}"
    ;;
url) cat "$dir/url" ;;
stop)
    as_pg "$(pg_bin)/pg_ctl" -D "$dir/data" -m immediate stop > /dev/null || true
    ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
