#!/usr/bin/env bash
# Installs what the tests and the sandbox need, idempotently: uv, the locked
# Python environment, Debian packages (promtool/prometheus, shellcheck, buildah and
# mmdebstrap for the images) and the pinned Kubernetes binaries (built once per
# version into a cache outside the repo).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
UV_VERSION=0.13.9

log() { printf '[bootstrap %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if ! command -v uv >/dev/null 2>&1; then
  log "installing uv ${UV_VERSION} from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check "uv==${UV_VERSION}"
fi

missing=()
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# The images without a Docker engine: buildah, and mmdebstrap for their offline base.
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The prometheus package starts a service on :9090; tests run their own server.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus 2>/dev/null || true; fi
  pkill -x prometheus 2>/dev/null || true
fi

log "syncing the Python workspace (uv.lock)"
bash hack/sync.sh

if [ -f hack/k8s-tools.sh ]; then
  log "providing the pinned Kubernetes binaries"
  bash hack/k8s-tools.sh
fi
log "done"
