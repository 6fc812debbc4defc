#!/usr/bin/env bash
# Installs the Debian package built by packaging/build-deb.sh, checks what
# it put where, starts the server from the installed files the way the
# systemd unit does, publishes, receives and acks one message with the
# installed CLI, stops the server with SIGTERM and purges the package.
#
#   packaging/smoke-deb.sh [PATH.deb]   (default: the newest target/debian/letterbox_*.deb)
#
# Needs root (it installs a package and creates a system user); without it
# it says so and does nothing. The machine has no running systemd here, so
# the unit's ExecStart is run by hand: as the unit's User= and Group=, with
# only the unit's Environment= variables and what systemd itself sets, from
# /. The package is purged at the end, also when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/lib.sh

if [ "$(id -u)" != 0 ]; then
  echo "smoke-deb: skipped: installing a package needs root"
  exit 0
fi

deb=${1:-}
if [ -z "$deb" ]; then
  for f in "${CARGO_TARGET_DIR:-target}"/debian/letterbox_*.deb; do
    [ -e "$f" ] || continue
    if [ -z "$deb" ] || [ "$f" -nt "$deb" ]; then deb=$f; fi
  done
fi
if [ -z "$deb" ] || [ ! -f "$deb" ]; then
  echo "smoke-deb: no .deb (run packaging/build-deb.sh)" >&2
  exit 1
fi
deb=$(realpath "$deb")

fail() { echo "smoke-deb: FAILED: $*" >&2; exit 1; }
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -y -q "$@"; }

# One smoke run at a time on a machine: the package, its user and
# /var/lib/letterbox are machine-wide.
exec 9>/run/lock/letterbox-smoke-deb.lock
flock 9

status=$(dpkg-query -W -f '${db:Status-Status}' letterbox 2>/dev/null || true)
if [ -n "$status" ] && [ "$status" != not-installed ]; then
  fail "a letterbox package is on this machine ($status); this test installs and purges its own"
fi
if getent passwd letterbox >/dev/null || [ -e /var/lib/letterbox ]; then
  fail "a letterbox user or /var/lib/letterbox exists without the package; remove them first"
fi

work=$(mktemp -d)
server_pid=
installed=
cleanup() {
  [ -z "$server_pid" ] || kill_pid "$server_pid"
  if [ -n "$installed" ]; then
    apt_get purge letterbox >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "smoke-deb: installing $deb"
installed=1
apt_get install "$deb" >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get install"; }

# What the package put where.
for f in /usr/bin/letterbox \
  /usr/share/bash-completion/completions/letterbox \
  /usr/share/zsh/vendor-completions/_letterbox \
  /usr/share/fish/vendor_completions.d/letterbox.fish \
  /usr/share/man/man1/letterbox.1.gz \
  /usr/share/man/man1/letterbox-serve.1.gz; do
  [ -s "$f" ] || fail "$f is missing or empty"
done
grep -q 'complete -F _letterbox' /usr/share/bash-completion/completions/letterbox ||
  fail "the bash completion does not complete letterbox"
zcat /usr/share/man/man1/letterbox-serve.1.gz | grep -q '^\.TH' || fail "letterbox-serve.1.gz is not a man page"
unit=$(dpkg -L letterbox | grep '/systemd/system/letterbox\.service$') || fail "no letterbox.service in the package"
conf=/etc/letterbox/letterbox.toml
grep -qx "$conf" /var/lib/dpkg/info/letterbox.conffiles || fail "$conf is not a conffile"
[ "$(stat -c '%U:%G %a' "$conf")" = "root:letterbox 640" ] ||
  fail "$conf is $(stat -c '%U:%G %a' "$conf"), not root:letterbox 640"
getent passwd letterbox >/dev/null || fail "no letterbox user"
[ "$(stat -c '%U:%G %a' /var/lib/letterbox)" = "letterbox:letterbox 700" ] ||
  fail "/var/lib/letterbox is $(stat -c '%U:%G %a' /var/lib/letterbox), not letterbox:letterbox 700"
# Enabled on install, whether or not systemd runs (deb-systemd-helper).
[ -L /etc/systemd/system/multi-user.target.wants/letterbox.service ] ||
  fail "the unit was not enabled (no multi-user.target.wants link)"

# The unit, read as systemd would use it: ExecStart, User, Group,
# Environment (a line may hold several NAME=VALUE words).
unit_value() { sed -n "s/^$1=//p" "$unit"; }
exec_start=$(unit_value ExecStart)
user=$(unit_value User)
group=$(unit_value Group)
if [ -z "$exec_start" ] || [ "$(printf '%s\n' "$exec_start" | wc -l)" != 1 ]; then
  fail "expected one ExecStart= in $unit, found: $exec_start"
fi
case "$exec_start" in [-@:+!]*) fail "ExecStart prefixes are not handled here: $exec_start" ;; esac
if [ -z "$user" ] || [ -z "$group" ]; then fail "$unit names no User= and Group="; fi
unit_env=()
while IFS= read -r line; do
  case "$line" in *[\"\'\\]*) fail "quoted Environment= values are not handled here: $line" ;; esac
  read -ra words <<<"$line"
  unit_env+=("${words[@]}")
done < <(unit_value Environment)
echo "smoke-deb: starting, as $user:$group: ${unit_env[*]:+${unit_env[*]} }$exec_start"

# The installed configuration as is, unless its address is taken on this
# machine (another server): then only the port changes, to one the system
# picks.
listen=$(sed -n 's/^listen *= *"\(.*\)"$/\1/p' "$conf")
[ -n "$listen" ] || fail "no listen = in $conf"
if port_open "${listen##*:}" "${listen%:*}"; then
  echo "smoke-deb: $listen is in use here: LETTERBOX_LISTEN=${listen%:*}:0 for this run"
  unit_env+=("LETTERBOX_LISTEN=${listen%:*}:0")
fi

# Created here, not by the background job's redirection, which may come
# after the first read below.
: >"$work/server.out"
cd /
setpriv --reuid="$user" --regid="$group" --init-groups \
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME="$(getent passwd "$user" | cut -d: -f6)" USER="$user" LOGNAME="$user" "${unit_env[@]}" \
  sh -c "exec $exec_start" >"$work/server.out" 2>"$work/server.log" &
server_pid=$!
echo "$server_pid" >"$work/server.job"
cd - >/dev/null

wait_letterbox "$work" 30 || fail "the server did not print its address"
addr=$SERVER_ADDR
[ "$(ps -o user= -p "$server_pid")" = "$user" ] || fail "the server does not run as $user"
echo "smoke-deb: server $server_pid listening on $addr"

# One message through the installed CLI (no profiles of this machine's
# root: a configuration home of its own).
cli() { LETTERBOX_CONFIG_HOME="$work/cli" LETTERBOX_SERVER="http://$addr" /usr/bin/letterbox "$@"; }
cli queue create smoke >/dev/null
cli publish smoke "hello from the package" >/dev/null
got=$(cli consume smoke --count 1 --json)
echo "smoke-deb: consumed: $got"
grep -q '"hello from the package"' <<<"$got" || fail "consume did not return the message"
stats=$(cli queue stats smoke --json)
if ! grep -Eq '^ *"acked": 1,?$' <<<"$stats" || ! grep -Eq '^ *"total": 0,?$' <<<"$stats"; then
  fail "the message was not acked, or is still in the queue: $stats"
fi

# The data is in the state directory, owned by the service user.
data=/var/lib/letterbox/data
[ "$(stat -c '%U %a' "$data")" = "$user 700" ] || fail "$data is $(stat -c '%U %a' "$data")"
[ -f "$data/FORMAT" ] || fail "no $data/FORMAT"
find "$data/wal" -type f -size +0 | grep -q . || fail "no log segment written in $data/wal"

kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=
[ "$status" = 0 ] || { cat "$work/server.log" >&2; fail "the server exited with $status after SIGTERM"; }
grep -q '"level":"INFO"' "$work/server.log" || fail "the server's log is not JSON (log_format in $conf)"
setpriv --reuid="$user" --regid="$group" --init-groups /usr/bin/letterbox verify --data-dir "$data" >"$work/verify.out" ||
  { cat "$work/verify.out" >&2; fail "letterbox verify $data"; }
echo "smoke-deb: stopped cleanly; verify: $(tail -n 1 "$work/verify.out")"

installed=
apt_get purge letterbox >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; fail "apt-get purge"; }
for p in /usr/bin/letterbox /etc/letterbox /var/lib/letterbox \
  /etc/systemd/system/multi-user.target.wants/letterbox.service; do
  [ ! -e "$p" ] || fail "$p is left after the purge"
done
! getent passwd letterbox >/dev/null || fail "the letterbox user is left after the purge"
! getent group letterbox >/dev/null || fail "the letterbox group is left after the purge"
echo "smoke-deb: passed (installed, served, purged)"
