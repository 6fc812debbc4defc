#!/usr/bin/env bash
# Builds the container image localhost/letterbox:<version> from
# packaging/Containerfile with podman: the release binary (stripped) and
# the shared libraries `ldd` lists, staged in target/release/image/.
#
#   packaging/build-image.sh [PODMAN GLOBAL FLAGS...]   (e.g. --root DIR --runroot DIR)
#
# Prints the image name on its last line. Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --bin letterbox
release="${CARGO_TARGET_DIR:-target}/release"
version=$("$release/letterbox" --version | awk '{print $2}')

context="$release/image"
rm -rf "$context"
mkdir -p "$context/rootfs/usr/bin" "$context/state/letterbox"
chmod 0700 "$context/state/letterbox"
cp "$release/letterbox" "$context/rootfs/usr/bin/letterbox"
strip "$context/rootfs/usr/bin/letterbox"
# The dynamic loader and every library, at the paths the binary asks for.
libs=$(ldd "$release/letterbox" | grep -o '/[^ ]*') ||
  { echo "build-image: ldd found no libraries for $release/letterbox" >&2; exit 1; }
for lib in $libs; do
  mkdir -p "$context/rootfs$(dirname "$lib")"
  cp -L "$lib" "$context/rootfs$lib"
done

image="localhost/letterbox:$version"
podman "$@" build --format docker --file packaging/Containerfile --tag "$image" "$context" >&2
echo "$image"
