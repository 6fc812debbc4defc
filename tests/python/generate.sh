#!/usr/bin/env bash
# Generates the Python gRPC client of proto/letterbox/v1/letterbox.proto.
#
#   tests/python/generate.sh [OUT_DIR]      (default: target/python-client)
#
# Needs a Python with grpcio-tools (tests/python/requirements.txt); set
# PYTHON to choose it (tests/python/run.sh passes its virtualenv's). The
# output is build output, never committed: the directory is emptied and
# written again on every run, so it cannot hold stubs of a stale proto.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

python="${PYTHON:-python3}"
out="${1:-target/python-client}"

case "$out" in
  "" | / | . | .. | proto | proto/*) echo "generate.sh: refusing to use $out as the output directory" >&2; exit 2 ;;
esac
rm -rf "$out"
mkdir -p "$out"
"$python" -m grpc_tools.protoc \
  -I proto \
  --python_out="$out" \
  --pyi_out="$out" \
  --grpc_python_out="$out" \
  proto/letterbox/v1/letterbox.proto

# Regular packages, so that `import letterbox.v1` cannot pick up a namespace
# package of the same name from elsewhere on sys.path.
touch "$out/letterbox/__init__.py" "$out/letterbox/v1/__init__.py"
echo "generated Python client in $out:"
(cd "$out" && find . -name '*.py' -o -name '*.pyi' | sort | sed 's|^\./|  |')
