#!/usr/bin/env bash
# Builds the Debian package target/debian/letterbox_<version>-1_<arch>.deb
# ([package.metadata.deb] in Cargo.toml): the release binary, then the shell
# completions and man pages generated from that binary, then
# `cargo deb --no-build`, which packages them. Installs cargo-deb first if
# it is missing. Honours CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb (cargo install cargo-deb --locked)"
  cargo install cargo-deb --locked
fi

cargo build --release --bin letterbox
release="${CARGO_TARGET_DIR:-target}/release"
bin="$release/letterbox"

# The asset paths in Cargo.toml say target/release/deb-assets; cargo-deb
# maps target/release to the real target directory.
assets="$release/deb-assets"
rm -rf "$assets"
mkdir -p "$assets/man"
"$bin" completions bash >"$assets/letterbox.bash"
"$bin" completions zsh >"$assets/_letterbox"
"$bin" completions fish >"$assets/letterbox.fish"
"$bin" man --out-dir "$assets/man"
gzip -9 -n "$assets"/man/*.1
for f in letterbox.bash _letterbox letterbox.fish man/letterbox.1.gz man/letterbox-serve.1.gz; do
  [ -s "$assets/$f" ] || { echo "build-deb: $assets/$f is missing or empty" >&2; exit 1; }
done

cargo deb --no-build "$@"
