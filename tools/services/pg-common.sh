# shellcheck shell=bash
# Shared by tools/services/pg-local.sh and tools/services/patroni-cluster.sh (sourced, not
# run): where Debian's PostgreSQL binaries are, and running a command as
# the `postgres` user under root (PostgreSQL refuses to run as root).

# The directory of the newest installed PostgreSQL's binaries; exits when
# there is none.
pg_bin() {
    local initdb
    initdb=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)
    [ -n "$initdb" ] || { echo "no PostgreSQL server found (apt-get install postgresql)" >&2; exit 1; }
    dirname "$initdb"
}

# Runs "$@" as the `postgres` user under root, else as the caller.
as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
