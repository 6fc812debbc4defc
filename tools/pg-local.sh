#!/usr/bin/env bash
# One throwaway PostgreSQL on loopback, for running Letterbox's suite
# against its PostgreSQL store (Debian's `postgresql` package). PostgreSQL
# refuses to run as root: under root it runs as the `postgres` user.
#
# Usage:
#   tools/pg-local.sh start DIR [PORT]  initdb in DIR, start on 127.0.0.1:PORT
#                                       (default 5439), print the admin URL
#   tools/pg-local.sh url DIR           the admin URL again
#   tools/pg-local.sh stop DIR          stop it (immediate)
set -euo pipefail

cmd=${1:?usage: $0 start|url|stop DIR [PORT]}
dir=${2:?give a scratch directory}

pg_bin() {
    local initdb
    initdb=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)
    [ -n "$initdb" ] || { echo "no PostgreSQL server found (apt-get install postgresql)" >&2; exit 1; }
    dirname "$initdb"
}

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
    port=${3:-5439}
    bin=$(pg_bin)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_pg "$bin/initdb" -D "$dir/data" -A trust -U postgres --no-sync > "$dir/initdb.log"
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200" start > /dev/null
    echo "postgres://postgres@127.0.0.1:$port/postgres" | tee "$dir/url"
    ;;
url) cat "$dir/url" ;;
stop)
    as_pg "$(pg_bin)/pg_ctl" -D "$dir/data" -m immediate stop > /dev/null || true
    ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
