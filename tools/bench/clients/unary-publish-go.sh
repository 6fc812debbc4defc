#!/usr/bin/env bash
# Builds tools/bench/clients/unary_publish_go (unary Publish from Go's generated
# client, see its main.go) offline, from Debian's packages: golang-go,
# golang-google-grpc-dev, golang-google-protobuf-dev,
# golang-github-golang-protobuf-1-5-dev (grpc-go's codec goes through it;
# its 1.3 version cannot decode the generated messages), protobuf-compiler,
# protoc-gen-go and protoc-gen-go-grpc. The client is generated from
# proto/ into a scratch GOPATH beside Debian's /usr/share/gocode and built
# there without modules (nothing is downloaded). Prints the binary's path.
#
#   bin=$(tools/bench/clients/unary-publish-go.sh)
#   $bin -target 127.0.0.1:50051 -queue bench -window 64 -count 20000
#
# OUT (the binary, default target/unary-publish-go).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/unary-publish-go}
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src/letterbox/v1" "$gopath/src/unarypublish"
m=Mletterbox/v1/letterbox.proto=letterbox/v1
protoc -I proto \
  --go_out="$gopath/src/letterbox/v1" --go_opt=paths=source_relative --go_opt=$m \
  --go-grpc_out="$gopath/src/letterbox/v1" --go-grpc_opt=paths=source_relative --go-grpc_opt=$m \
  letterbox/v1/letterbox.proto
# paths=source_relative writes letterbox/v1/ under the out directory.
mv "$gopath/src/letterbox/v1/letterbox/v1/"*.go "$gopath/src/letterbox/v1/"
cp tools/bench/clients/unary_publish_go/main.go "$gopath/src/unarypublish/"
mkdir -p "$(dirname "$out")"
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="$gopath/cache" GOFLAGS= \
  go build -o "$out" unarypublish >&2
echo "$out"
