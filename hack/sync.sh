#!/usr/bin/env bash
# Installs the locked workspace into .venv. Members are installed as strict
# editable link trees, so every member is rebuilt to pick up new module files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
args=()
while read -r name; do
  args+=(--reinstall-package "$name")
done < <(python3 hack/members.py --names)
if command -v uv >/dev/null 2>&1; then uv=(uv); else uv=(python3 -m uv); fi
"${uv[@]}" sync --locked --quiet "${args[@]}"
