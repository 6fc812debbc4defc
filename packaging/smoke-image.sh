#!/usr/bin/env bash
# Builds the container image (packaging/build-image.sh) in a podman storage
# of its own, runs it, publishes, receives and acks one message through the
# published port with the letterbox CLI, stops the container (SIGTERM) and
# removes everything it made.
#
#   packaging/smoke-image.sh
#
# Needs podman and root; without them it says why it skips. Two settings
# are for machines like the one CI runs on, and harmless elsewhere: the
# runc runtime when it is installed (crun refuses a host whose cgroups are
# mounted v1 and v2 side by side), and open-file and process limits no
# higher than the host's (podman raises them by default, which a host may
# refuse).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "smoke-image: skipped: runs podman as root (rootless podman needs user namespaces set up)"
  exit 0
fi
if ! command -v podman >/dev/null; then
  echo "smoke-image: skipped: podman is not installed (apt-get install podman runc)"
  exit 0
fi

fail() { echo "smoke-image: FAILED: $*" >&2; exit 1; }

work=$(mktemp -d)
storage=(--root "$work/storage" --runroot "$work/run")
pod() { podman "${storage[@]}" "$@"; }
name="letterbox-smoke-$$"
cleanup() {
  pod rm --force --volumes "$name" >/dev/null 2>&1 || true
  pod system reset --force >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

image=$(packaging/build-image.sh "${storage[@]}" 2>"$work/build.log" | tail -n 1) ||
  { cat "$work/build.log" >&2; fail "packaging/build-image.sh"; }
echo "smoke-image: built $image"

nofile=$(ulimit -Hn)
if [ "$nofile" = unlimited ]; then nofile=1048576; fi
run_flags=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
if command -v runc >/dev/null; then run_flags+=(--runtime runc); fi

# As it comes, without principals, it refuses its non-loopback address
# (exit 2, naming the flag that allows it).
status=0
pod run --rm "${run_flags[@]}" "$image" >"$work/refused.out" 2>&1 || status=$?
[ "$status" = 2 ] || { cat "$work/refused.out" >&2; fail "without principals: exit $status, not 2"; }
grep -q -- '--allow-remote-without-auth' "$work/refused.out" ||
  fail "the refusal does not name --allow-remote-without-auth: $(cat "$work/refused.out")"

pod run --detach --name "$name" "${run_flags[@]}" --publish 127.0.0.1::50051 \
  "$image" serve --allow-remote-without-auth >/dev/null
for _ in $(seq 300); do
  pod logs "$name" 2>/dev/null | grep -q '^letterbox listening on ' && break
  [ "$(pod inspect --format '{{.State.Running}}' "$name")" = true ] ||
    { pod logs "$name" >&2; fail "the container exited at start"; }
  sleep 0.1
done
pod logs "$name" 2>/dev/null | grep -q '^letterbox listening on 0.0.0.0:50051$' ||
  { pod logs "$name" >&2; fail "the server did not print its address within 30 s"; }
port=$(pod port "$name" 50051/tcp)
echo "smoke-image: container $name serving, published on $port"

cli() {
  LETTERBOX_CONFIG_HOME="$work/cli" LETTERBOX_SERVER="http://$port" \
    "${CARGO_TARGET_DIR:-target}/release/letterbox" "$@"
}
cli queue create smoke >/dev/null
cli publish smoke "hello from the image" >/dev/null
got=$(cli consume smoke --count 1 --json)
echo "smoke-image: consumed: $got"
grep -q '"hello from the image"' <<<"$got" || fail "consume did not return the message"
stats=$(cli queue stats smoke --json)
if ! grep -Eq '^ *"acked": 1,?$' <<<"$stats" || ! grep -Eq '^ *"total": 0,?$' <<<"$stats"; then
  fail "the message was not acked, or is still in the queue: $stats"
fi

# The image's health check (the gRPC health service, through the CLI in
# the image) says healthy.
[ "$(pod inspect --format '{{join .Config.Healthcheck.Test " "}}' "$name")" = "CMD-EXEC /usr/bin/letterbox health" ] ||
  [ "$(pod inspect --format '{{join .Config.Healthcheck.Test " "}}' "$name")" = "CMD /usr/bin/letterbox health" ] ||
  fail "no health check in the image: $(pod inspect --format '{{.Config.Healthcheck}}' "$name")"
pod healthcheck run "$name" >"$work/health.out" 2>&1 ||
  { cat "$work/health.out" >&2; fail "the health check failed on a serving container"; }
echo "smoke-image: health check: healthy"

pod stop --time 30 "$name" >/dev/null
code=$(pod inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { pod logs "$name" >&2; fail "the server exited with $code after SIGTERM"; }
pod logs "$name" 2>&1 | grep -q 'stopped cleanly' || fail "no clean stop in the log"

# The data is in the volume, owned by the image's user.
volume=$(pod inspect --format '{{range .Mounts}}{{if eq .Destination "/var/lib/letterbox"}}{{.Source}}{{end}}{{end}}' "$name")
[ -n "$volume" ] || fail "no volume at /var/lib/letterbox"
[ "$(stat -c '%u %a' "$volume/data")" = "65532 700" ] ||
  fail "$volume/data is $(stat -c '%u %a' "$volume/data"), not 65532 700"
[ -f "$volume/data/FORMAT" ] || fail "no FORMAT in the volume's data directory"
echo "smoke-image: passed (built, served from the image, healthy, stopped cleanly)"
