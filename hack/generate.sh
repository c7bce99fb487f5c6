#!/usr/bin/env bash
# Generates the Python gRPC stubs and their typed stubs (.pyi) of every .proto:
#   proto/ (the shared contract)  -> beside each .proto, import root lj_runtimekit.proto
#   Controller/api/proto          -> Controller/pkg/configpb,
#                                    import path lj_runtimekit.controller.pkg.configpb
#   hack/generate.sh          write the stubs
#   hack/generate.sh --check  fail when a committed stub differs from a fresh one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-write}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# source directory | its folders holding .proto files | import path of the stubs |
# directory the stubs are written to
sources=(
  "proto|lingjun k8s|lj_runtimekit/proto|proto"
  "Controller/api/proto|.|lj_runtimekit/controller/pkg/configpb|Controller/pkg/configpb"
)

stale=0
count=0
for source in "${sources[@]}"; do
  IFS="|" read -r src folders import dest <<<"$source"
  read -r -a folders <<<"$folders"
  mapfile -t protos < <(cd "$src" && find "${folders[@]}" -name '*.proto' | sed 's|^\./||' | sort)
  count=$((count + ${#protos[@]}))
  python -m grpc_tools.protoc \
    --proto_path="$import=$src" \
    --python_out="$out" --grpc_python_out="$out" \
    --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
    "${protos[@]/#/$import/}"
  for p in "${protos[@]}"; do
    dir=$(dirname "$p")
    base=$(basename "$p" .proto)
    for suffix in _pb2.py _pb2.pyi _pb2_grpc.py _pb2_grpc.pyi; do
      fresh="$out/$import/$dir/$base$suffix"
      committed="$dest/$dir/$base$suffix"
      if [ "$mode" = "--check" ]; then
        if ! cmp -s "$fresh" "$committed"; then
          echo "stale generated file: $committed (run: make generate)" >&2
          stale=1
        fi
      else
        mkdir -p "$(dirname "$committed")"
        cp "$fresh" "$committed"
      fi
    done
    if [ ! -f "$dest/$dir/__init__.py" ]; then
      if [ "$mode" = "--check" ]; then
        echo "missing generated file: $dest/$dir/__init__.py (run: make generate)" >&2
        stale=1
      else
        echo '"""Generated protobuf package."""' > "$dest/$dir/__init__.py"
      fi
    fi
  done
done

if [ "$mode" = "--check" ]; then
  [ "$stale" = 0 ] && echo "generated stubs are up to date ($count proto files)"
  exit "$stale"
fi
echo "generated stubs for $count proto files"
