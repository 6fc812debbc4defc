#!/usr/bin/env bash
# A replicated PostgreSQL on loopback for Letterbox's PostgreSQL state:
# three etcd members and three PostgreSQL 15 nodes under Patroni, with a
# synchronous standby (synchronous_mode_strict: a commit is acknowledged
# only once a standby has it). Everything from Debian's packages:
#
#   apt-get install -y --no-install-recommends postgresql patroni etcd-server etcd-client
#
# Usage:
#   tools/services/patroni-cluster.sh start DIR    start, wait for a leader and a sync standby
#   tools/services/patroni-cluster.sh url DIR      the multi-host URL of the primary
#   tools/services/patroni-cluster.sh leader DIR   the leader's name (pg1, pg2 or pg3)
#   tools/services/patroni-cluster.sh kill-leader DIR
#                                         kill -9 of the leader's Patroni and postmaster
#   tools/services/patroni-cluster.sh status DIR   patronictl list
#   tools/services/patroni-cluster.sh stop DIR     stop everything started in DIR
#
# Ports: etcd clients 12379/22379/32379 (peers x2380), PostgreSQL
# 5441-5443, Patroni's REST API 8001-8003. PostgreSQL refuses to run as
# root: under root, Patroni runs as the `postgres` user (runuser).
set -euo pipefail

cmd=${1:?usage: $0 start|url|leader|kill-leader|status|stop DIR}
dir=${2:?give a scratch directory}
TTL=${PATRONI_TTL:-10}

. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
. "$(dirname "${BASH_SOURCE[0]}")/pg-common.sh"

etcd_hosts="127.0.0.1:12379,127.0.0.1:22379,127.0.0.1:32379"

start() {
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local bin cluster
    bin=$(pg_bin)
    cluster=e1=http://127.0.0.1:12380,e2=http://127.0.0.1:22380,e3=http://127.0.0.1:32380
    for i in 1 2 3; do
        etcd --name e$i --data-dir "$dir/etcd$i" \
            --listen-client-urls http://127.0.0.1:${i}2379 \
            --advertise-client-urls http://127.0.0.1:${i}2379 \
            --listen-peer-urls http://127.0.0.1:${i}2380 \
            --initial-advertise-peer-urls http://127.0.0.1:${i}2380 \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token letterbox > "$dir/etcd$i.log" 2>&1 &
        echo $! > "$dir/etcd$i.pid"
    done
    for _ in $(seq 100); do
        ETCDCTL_API=3 etcdctl --endpoints="$etcd_hosts" endpoint health > /dev/null 2>&1 && break
        sleep 0.2
    done
    ETCDCTL_API=3 etcdctl --endpoints="$etcd_hosts" endpoint health > /dev/null 2>&1 \
        || { echo "etcd did not become healthy (logs in $dir)" >&2; exit 1; }

    for i in 1 2 3; do
        mkdir -p "$dir/pg$i"
        cat > "$dir/pg$i/patroni.yml" <<EOF
scope: letterbox
name: pg$i
restapi: {listen: 127.0.0.1:800$i, connect_address: 127.0.0.1:800$i}
etcd3: {hosts: "$etcd_hosts"}
bootstrap:
  dcs:
    ttl: $TTL
    loop_wait: 1
    retry_timeout: $(( (TTL - 1) / 2 ))
    maximum_lag_on_failover: 0
    synchronous_mode: true
    synchronous_mode_strict: true
    postgresql:
      use_pg_rewind: true
      parameters: {synchronous_commit: "on", wal_level: replica, hot_standby: "on",
                   max_wal_senders: 10, max_replication_slots: 10, wal_log_hints: "on",
                   shared_buffers: 64MB, fsync: "on"}
  initdb: [{encoding: UTF8}, data-checksums]
  pg_hba: ["local all all trust", "host replication replicator 127.0.0.1/32 trust",
           "host all all 127.0.0.1/32 trust"]
postgresql:
  listen: 127.0.0.1:544$i
  connect_address: 127.0.0.1:544$i
  data_dir: $dir/pg$i/data
  bin_dir: $bin
  pgpass: $dir/pg$i/pgpass
  authentication: {replication: {username: replicator, password: rep},
                   superuser: {username: postgres, password: pg}}
  parameters: {unix_socket_directories: $dir/pg$i}
EOF
    done
    if [ "$(id -u)" = 0 ]; then chown -R postgres "$dir"/pg1 "$dir"/pg2 "$dir"/pg3; chmod 755 "$dir"; fi
    for i in 1 2 3; do
        # The pid file is written by the process that becomes Patroni, so
        # it names Patroni and not runuser.
        as_pg sh -c 'echo $$ > "$1/patroni.pid"; exec patroni "$1/patroni.yml"' sh "$dir/pg$i" \
            > "$dir/patroni$i.log" 2>&1 &
    done
    local waited=0
    until status | grep -q 'Sync Standby' && status | grep -q 'Leader.*running'; do
        sleep 0.5
        waited=$((waited + 1))
        if [ $waited -gt 240 ]; then
            echo "no leader and sync standby after 120 s (logs in $dir):" >&2
            status >&2 || true
            exit 1
        fi
    done
}

status() {
    patronictl -c "$dir/pg1/patroni.yml" list 2>/dev/null
}

leader() {
    status | awk -F'|' '/Leader/ { gsub(/ /, "", $2); print $2 }'
}

url() {
    echo "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442,127.0.0.1:5443/postgres?target_session_attrs=read-write&connect_timeout=2"
}

kill_leader() {
    local name i postmaster
    name=$(leader)
    [ -n "$name" ] || { echo "no leader" >&2; exit 1; }
    i=${name#pg}
    postmaster=$(head -1 "$dir/pg$i/data/postmaster.pid")
    kill -9 "$(cat "$dir/pg$i/patroni.pid")" "$postmaster"
    echo "$name"
}

stop() {
    local patronis=() postmasters=() etcds=() f
    for i in 1 2 3; do
        f="$dir/pg$i/patroni.pid"; [ -f "$f" ] && patronis+=("$(cat "$f")")
        f="$dir/pg$i/data/postmaster.pid"; [ -f "$f" ] && postmasters+=("$(head -1 "$f")")
        f="$dir/etcd$i.pid"; [ -f "$f" ] && etcds+=("$(cat "$f")")
    done
    # Patroni stops its PostgreSQL on SIGTERM (it needs etcd for that, so
    # etcd goes last); what is left after 30 s is killed.
    [ ${#patronis[@]} -gt 0 ] && kill "${patronis[@]}" 2>/dev/null || true
    wait_gone 300 "${patronis[@]}" "${postmasters[@]}" \
        || kill -9 "${patronis[@]}" "${postmasters[@]}" 2>/dev/null || true
    # A postmaster Patroni started again meanwhile: by its pid file.
    for i in 1 2 3; do
        f="$dir/pg$i/data/postmaster.pid"
        [ -f "$f" ] && kill -9 "$(head -1 "$f")" 2>/dev/null || true
    done
    [ ${#etcds[@]} -gt 0 ] && kill "${etcds[@]}" 2>/dev/null || true
    wait_gone 100 "${etcds[@]}" || kill -9 "${etcds[@]}" 2>/dev/null || true
}

case "$cmd" in
    start) start ;;
    url) url ;;
    leader) leader ;;
    kill-leader) kill_leader ;;
    status) status ;;
    stop) stop ;;
    *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
