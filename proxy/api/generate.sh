#!/usr/bin/env bash
# Regenerate the Python gRPC stubs in proxy/api/v2/ from proxy/api/proto/.
# Usage: proxy/api/generate.sh   (from anywhere; uses PYTHON or the project venv)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PROTO_DIR=proxy/api/proto
OUT_DIR=proxy/api/v2
SRC="$PROTO_DIR/apache/rocketmq/v2"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PYTHON" -m grpc_tools.protoc \
  -I "$PROTO_DIR" \
  --python_out="$TMP" \
  --pyi_out="$TMP" \
  --grpc_python_out="$TMP" \
  "$SRC/definition.proto" \
  "$SRC/service.proto"

mkdir -p "$OUT_DIR"
for f in "$TMP"/apache/rocketmq/v2/*.py "$TMP"/apache/rocketmq/v2/*.pyi; do
  # protoc emits "from apache.rocketmq.v2 import x_pb2 as ..."; make it
  # package-relative so the stubs import as proxy.api.v2.x_pb2.
  sed -E 's/^from apache\.rocketmq\.v2 import /from . import /' "$f" > "$OUT_DIR/$(basename "$f")"
done

if [ ! -f "$OUT_DIR/__init__.py" ]; then
  printf '""""""\n' > "$OUT_DIR/__init__.py"
fi

if grep -qE '^(from|import) apache\.' "$OUT_DIR"/*.py "$OUT_DIR"/*.pyi; then
  echo "generate.sh: absolute apache.* import left over" >&2
  exit 1
fi
echo "generated: $(ls "$OUT_DIR" | tr '\n' ' ')"
