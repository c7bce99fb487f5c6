#!/usr/bin/env bash
# Generates the Python gRPC stubs and their typed stubs (.pyi) for every
# .proto under proto/, in place, with import paths rooted at lj_runtimekit.proto.
#   hack/generate.sh          write the stubs
#   hack/generate.sh --check  fail when a committed stub differs from a fresh one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-write}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

mapfile -t protos < <(cd proto && find lingjun k8s -name '*.proto' | sort)
python -m grpc_tools.protoc \
  --proto_path="lj_runtimekit/proto=proto" \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
  "${protos[@]/#/lj_runtimekit/proto/}"

stale=0
for p in "${protos[@]}"; do
  dir=$(dirname "$p")
  base=$(basename "$p" .proto)
  for suffix in _pb2.py _pb2.pyi _pb2_grpc.py _pb2_grpc.pyi; do
    fresh="$out/lj_runtimekit/proto/$dir/$base$suffix"
    committed="proto/$dir/$base$suffix"
    if [ "$mode" = "--check" ]; then
      if ! cmp -s "$fresh" "$committed"; then
        echo "stale generated file: $committed (run: make generate)" >&2
        stale=1
      fi
    else
      cp "$fresh" "$committed"
    fi
  done
  if [ ! -f "proto/$dir/__init__.py" ]; then
    if [ "$mode" = "--check" ]; then
      echo "missing generated file: proto/$dir/__init__.py (run: make generate)" >&2
      stale=1
    else
      echo '"""Generated protobuf package."""' > "proto/$dir/__init__.py"
    fi
  fi
done
if [ "$mode" = "--check" ]; then
  [ "$stale" = 0 ] && echo "generated stubs are up to date (${#protos[@]} proto files)"
  exit "$stale"
fi
echo "generated stubs for ${#protos[@]} proto files"
