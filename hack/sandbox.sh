#!/usr/bin/env bash
# Local sandbox: one Runtime simulator per example node, each shown through the
# project's own client (lj-runtime-ctl). Stays up until Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
state=${LJ_SANDBOX_DIR:-/tmp/lj-runtimekit-sandbox}
mkdir -p "$state"
pids=()

log() { printf '[sandbox %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  log "stopped; logs kept in $state"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

for node in tdm-8gpu mig-8gpu ppu-16; do
  dir="$state/$node"
  mkdir -p "$dir"
  log "starting Runtime simulator for node $node (socket dir $dir, log $dir/sim.log)"
  uv run lj-runtime-sim --node "proto/examples/nodes/$node.yaml" --socket-dir "$dir" >"$dir/sim.log" 2>&1 &
  pids+=("$!")
done

for node in tdm-8gpu mig-8gpu ppu-16; do
  dir="$state/$node"
  if ! uv run lj-runtime-ctl --socket-dir "$dir" --attempts 20 info; then
    log "step failed: Runtime simulator for $node did not answer; see $dir/sim.log"
    exit 1
  fi
  uv run lj-runtime-ctl --socket-dir "$dir" devices
  echo
done

log "sandbox is up. Try: uv run lj-runtime-ctl --socket-dir $state/mig-8gpu devices"
log "press Ctrl-C to stop"
while true; do sleep 3600; done
