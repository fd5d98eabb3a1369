#!/usr/bin/env bash
# The Rust proxy of the rocketmq-rust project (crates.io: rocketmq-proxy 1.0.0, binary
# rocketmq-proxy-rust), built once with cargo into .cache/rust-proxy/ for the peer benchmark
# (`python -m bench.peer --peers apache,rust,ours`). It needs protoc to build (its
# build script compiles the apache.rocketmq.v2 protos): Debian's protobuf-compiler, installed
# here when missing. Idempotent: a built binary is kept. Exit status non-zero, with cargo's
# output in .cache/rust-proxy/build.log, when it cannot be built.
set -euo pipefail

VERSION=1.0.0
ROOT="$(cd "$(dirname "$0")/.." && pwd)/.cache/rust-proxy"
BIN="$ROOT/bin/rocketmq-proxy-rust"
[ -x "$BIN" ] && [ -f "$ROOT/.version-$VERSION" ] && exit 0

if ! command -v protoc >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "rust-proxy: installing protobuf-compiler (protoc)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
fi

mkdir -p "$ROOT"
echo "rust-proxy: cargo install rocketmq-proxy $VERSION (cluster mode) into $ROOT; log: $ROOT/build.log"
if ! CARGO_TARGET_DIR="$ROOT/target" cargo install rocketmq-proxy --version "$VERSION" --locked \
    --no-default-features --features cluster-mode --root "$ROOT" >"$ROOT/build.log" 2>&1; then
  tail -20 "$ROOT/build.log" >&2
  exit 1
fi
touch "$ROOT/.version-$VERSION"
