#!/usr/bin/env bash
# Builds the wheel of every workspace member (or of the members named as
# arguments, by directory) into dist/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p dist
if [ "$#" -gt 0 ]; then members=("$@"); else mapfile -t members < <(python3 hack/members.py); fi
for member in "${members[@]}"; do
  echo "building wheel of $member"
  uv build --quiet --wheel --out-dir dist "$member"
done
ls -1 dist/*.whl
