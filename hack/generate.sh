#!/usr/bin/env bash
# Generates the Python gRPC stubs and their typed stubs (.pyi) for every
# .proto under proto/, in place, with import paths rooted at lj_runtimekit.proto.
# Also writes the descriptor set of the Runtime contract used by the
# additive-only check (proto/build/runtime_v1.binpb is the current one).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

mapfile -t protos < <(cd proto && find lingjun k8s -name '*.proto' | sort)
python -m grpc_tools.protoc \
  --proto_path="lj_runtimekit/proto=proto" \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out="$out" --mypy_grpc_out="$out" \
  "${protos[@]/#/lj_runtimekit/proto/}"

for p in "${protos[@]}"; do
  dir=$(dirname "$p")
  base=$(basename "$p" .proto)
  for suffix in _pb2.py _pb2.pyi _pb2_grpc.py _pb2_grpc.pyi; do
    cp "$out/lj_runtimekit/proto/$dir/$base$suffix" "proto/$dir/$base$suffix"
  done
  [ -f "proto/$dir/__init__.py" ] || echo '"""Generated protobuf package."""' > "proto/$dir/__init__.py"
done
echo "generated stubs for ${#protos[@]} proto files"
