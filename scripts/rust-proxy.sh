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

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v protoc >/dev/null 2>&1; then
  echo "rust-proxy: installing protobuf-compiler (protoc)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
fi

# protoc's well-known types (google/protobuf/duration.proto, ...): Debian ships them apart
# (libprotobuf-dev); grpcio-tools in the project's virtualenv carries them too.
WELL_KNOWN="$(cd "$(dirname "$0")/.." && pwd)/.venv/lib/python3.11/site-packages/grpc_tools/_proto"
if [ -f "$WELL_KNOWN/google/protobuf/duration.proto" ]; then
  export PROTOC_INCLUDE="$WELL_KNOWN"
elif [ ! -f /usr/include/google/protobuf/duration.proto ]; then
  $SUDO apt-get install -y -qq --no-install-recommends libprotobuf-dev >/dev/null
fi

mkdir -p "$ROOT"
echo "rust-proxy: cargo install rocketmq-proxy $VERSION (cluster mode) into $ROOT; log: $ROOT/build.log"
if ! CARGO_TARGET_DIR="$ROOT/target" cargo install rocketmq-proxy --version "$VERSION" --locked \
    --no-default-features --features cluster-mode --root "$ROOT" >"$ROOT/build.log" 2>&1; then
  tail -20 "$ROOT/build.log" >&2
  exit 1
fi
touch "$ROOT/.version-$VERSION"
