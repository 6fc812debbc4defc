# shellcheck shell=bash disable=SC2034
# What the scripts under tools/ share, sourced (not run), from a script in
# a folder of tools/:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
#
# Starting `letterbox serve` and reading the addresses it announces,
# waiting for a port, stopping processes by their PID. Nothing here finds
# a process by its name or command line: every process is the one a
# script started, known by the PID it got then.
#
# The server announces its listeners on standard output once they are
# bound (src/launch.rs), one line each, in this order:
#
#   letterbox listening on ADDR              (gRPC; always, first)
#   letterbox anypoint listening on ADDR     (with --anypoint-listen)
#   letterbox metrics on URL                 (with --metrics-listen)
#   letterbox console at URL                 (when the console is on)
#   letterbox sqs at URL                     (when the SQS endpoint is on)
#
# so a script can give it port 0 (`--listen 127.0.0.1:0`) and read the
# port it got. Its log goes to standard error.

# TOOLS_DIR: this directory. REPO_ROOT: the repository's. TARGET_DIR:
# cargo's target directory (CARGO_TARGET_DIR, else target/ in the
# repository).
TOOLS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$TOOLS_DIR/.." && pwd)
case "${CARGO_TARGET_DIR:-}" in
  "") TARGET_DIR=$REPO_ROOT/target ;;
  /*) TARGET_DIR=$CARGO_TARGET_DIR ;;
  *) TARGET_DIR=$PWD/$CARGO_TARGET_DIR ;;
esac

# The prefixes of the server's announcements (src/launch.rs).
LETTERBOX_GRPC_LINE="letterbox listening on "
LETTERBOX_METRICS_LINE="letterbox metrics on "
LETTERBOX_SQS_LINE="letterbox sqs at "

# port_open PORT [HOST]: something accepts connections on HOST:PORT
# (HOST 127.0.0.1).
port_open() {
  (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null
}

# wait_port PORT SECONDS [HOST]: waits until port_open; fails after
# SECONDS.
wait_port() {
  local end=$((SECONDS + $2))
  until port_open "$1" "${3:-127.0.0.1}"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.1
  done
}

# free_port: a TCP port on 127.0.0.1 that was free a moment ago, for a
# program that cannot be given port 0 and asked which port it got.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# pid_alive PID: the process runs (an exited child not yet waited for
# does not).
pid_alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}

# pidfile_alive FILE: FILE names a PID that runs.
pidfile_alive() {
  [ -f "$1" ] && pid_alive "$(cat "$1")"
}

# wait_gone TENTHS PID...: waits up to TENTHS tenths of a second until
# none of the PIDs runs; fails if one still does.
wait_gone() {
  local tenths=$1 p left i
  shift
  for ((i = 0; ; i++)); do
    left=0
    for p in "$@"; do pid_alive "$p" && left=1; done
    [ $left = 0 ] && return 0
    [ "$i" -lt "$tenths" ] || return 1
    sleep 0.1
  done
}

# stop_pid PID [GRACE_S] [LABEL]: SIGTERM, then SIGKILL if it still runs
# after GRACE_S seconds (30); waited for when it is this shell's child.
# With LABEL it says on standard error what it did.
stop_pid() {
  local pid=$1 grace=${2:-30} label=${3:-}
  if pid_alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone $((grace * 10)) "$pid"; then
      [ -z "$label" ] || echo "$label (pid $pid) did not exit after ${grace}s; KILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    [ -z "$label" ] || echo "stopped $label (pid $pid)" >&2
  fi
  wait "$pid" 2>/dev/null || true
}

# kill_pid PID...: SIGKILL, waited for (those that are this shell's
# children).
kill_pid() {
  local p
  for p in "$@"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}

# stop_pidfile FILE [GRACE_S] [LABEL]: stop_pid of the PID in FILE, then
# FILE is removed. Nothing when there is no FILE.
stop_pidfile() {
  [ -f "$1" ] || return 0
  stop_pid "$(cat "$1")" "${2:-30}" "${3:-}"
  rm -f "$1"
}

# child_pid PID: the PID of PID's only child (a wrapper's program).
child_pid() {
  local c
  c=$(cat "/proc/$1/task/$1/children" 2>/dev/null) || c=$(pgrep -P "$1")
  echo "${c%% *}"
}

# start_letterbox DIR BIN [SERVE_ARGS...]: starts `BIN serve SERVE_ARGS...`
# in the background, in a session of its own (a Ctrl-C at the terminal
# reaches the script, which stops it), with standard input closed, its
# standard output (the announcements) in DIR/server.out and its log in
# DIR/server.log (both emptied first), and does not wait. SERVE_WRAP, an
# array, goes in front of the command (e.g. SERVE_WRAP=(/usr/bin/time -o
# FILE -f "%U %S")). Sets SERVER_JOB to the PID to `wait` for (the
# wrapper's, if there is one); wait_letterbox finds the server's.
start_letterbox() {
  local dir=$1 bin=$2
  shift 2
  mkdir -p "$dir"
  : > "$dir/server.out"
  : > "$dir/server.log"
  rm -f "$dir/server.pid"
  local cmd=("${SERVE_WRAP[@]}" "$bin" serve "$@")
  # setsid forks (and its PID is not the server's) when it is a process
  # group leader, as a background job of a shell with job control is.
  [[ $- == *m* ]] || cmd=(setsid "${cmd[@]}")
  "${cmd[@]}" > "$dir/server.out" 2> "$dir/server.log" < /dev/null &
  SERVER_JOB=$!
  echo "$SERVER_JOB" > "$dir/server.job"
}

# announced DIR PREFIX: what follows PREFIX on the first line of
# DIR/server.out that starts with it (nothing if none does yet).
announced() {
  sed -n "s|^$2||p" "$1/server.out" 2>/dev/null | head -n 1
}

# wait_letterbox DIR [SECONDS]: waits (SECONDS, default 60) until the
# server started in DIR announces its gRPC address, then sets SERVER_PID
# (the server's PID, also written to DIR/server.pid), SERVER_ADDR
# (HOST:PORT) and SERVER_URL (http://HOST:PORT). Fails, with the end of
# its log on standard error, if it exits first or the time runs out.
wait_letterbox() {
  local dir=$1 secs=${2:-60} job addr
  job=$(cat "$dir/server.job")
  local end=$((SECONDS + secs))
  until addr=$(announced "$dir" "$LETTERBOX_GRPC_LINE") && [ -n "$addr" ]; do
    if ! pid_alive "$job"; then
      echo "the server in $dir exited while starting; the end of its log:" >&2
      tail -n 30 "$dir/server.log" >&2
      return 1
    fi
    if [ $SECONDS -ge $end ]; then
      echo "the server in $dir did not announce its address in ${secs}s; the end of its log:" >&2
      tail -n 30 "$dir/server.log" >&2
      return 1
    fi
    sleep 0.05
  done
  SERVER_PID=$job
  [ ${#SERVE_WRAP[@]} -eq 0 ] || SERVER_PID=$(child_pid "$job")
  echo "$SERVER_PID" > "$dir/server.pid"
  SERVER_ADDR=$addr
  SERVER_URL=http://$addr
}

# serve_letterbox DIR BIN [SERVE_ARGS...]: start_letterbox, then
# wait_letterbox (SERVE_WAIT seconds, 60).
serve_letterbox() {
  start_letterbox "$@"
  wait_letterbox "$1" "${SERVE_WAIT:-60}"
}

# thread_cpu_s PID NAME: the CPU seconds (user + system) of PID's thread
# named NAME (e.g. letterbox-apply), 0 when it has none.
thread_cpu_s() {
  local t s=0
  for t in /proc/"$1"/task/*; do
    if [ "$(cat "$t/comm" 2>/dev/null)" = "$2" ]; then
      s=$(awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "$t/stat")
    fi
  done
  echo "$s"
}

SERVE_WRAP=()
