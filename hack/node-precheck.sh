#!/usr/bin/env bash
# Checks, on a Lingjun node, what the LJ Runtime Kit components need there:
#   - the Runtime socket directory and its socket file(s)
#   - the Runtime answers; its version (lj-runtime-ctl info) is >= v1.13.0
#     (base features) and which later features it allows
#   - the kubelet read-only port (10255) answers /pods with a PodList (optional: a
#     warning only; without it deploy with --no-kubelet-read-only-port)
#   - the kubelet device plugin directory and kubelet.sock
#   - the container runtime defines the lj-runtime handler (containerd config)
#
# Usage: hack/node-precheck.sh [--socket-dir=DIR] [--socket-name=NAME]
#          [--kubelet-url=URL] [--plugin-dir=DIR] [--containerd-config=FILE]
# Environment: LJ_RUNTIME_CTL (the lj-runtime-ctl command; default: on PATH or
# the repository's .venv). Prints one ok/PROBLEM/warning line per check; exits 1
# when a check fails, each PROBLEM line saying what to fix.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
socket_dir=/run/amp/eKitC/xdm/sockets
socket_name=runtime.sock
kubelet_url=http://127.0.0.1:10255/pods
plugin_dir=/var/lib/kubelet/device-plugins
containerd_config=/etc/containerd/config.toml

die() { echo "node-precheck: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --socket-dir=*) socket_dir=${1#*=} ;;
    --socket-name=*) socket_name=${1#*=} ;;
    --kubelet-url=*) kubelet_url=${1#*=} ;;
    --plugin-dir=*) plugin_dir=${1#*=} ;;
    --containerd-config=*) containerd_config=${1#*=} ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done

problems=0
ok() { echo "ok      $*"; }
problem() { echo "PROBLEM $*"; problems=$((problems + 1)); }

# 1. Runtime sockets
if [[ ! -d $socket_dir ]]; then
  problem "Runtime socket directory $socket_dir does not exist; fix: start the Lingjun Runtime on this node (or pass --socket-dir)"
else
  sockets=()
  for f in "$socket_dir"/*; do [[ -S $f ]] && sockets+=("${f##*/}"); done
  if [[ -S $socket_dir/$socket_name ]]; then
    ok "Runtime sockets in $socket_dir: ${sockets[*]}"
  else
    problem "no Runtime socket $socket_dir/$socket_name (sockets there: ${sockets[*]:-none}); fix: start the Runtime, or pass --socket-name"
  fi
fi

# 2. Runtime version
ctl=()
if [[ -n ${LJ_RUNTIME_CTL:-} ]]; then
  read -r -a ctl <<<"$LJ_RUNTIME_CTL"
elif command -v lj-runtime-ctl >/dev/null 2>&1; then
  ctl=(lj-runtime-ctl)
elif [[ -x $root/.venv/bin/lj-runtime-ctl ]]; then
  ctl=("$root/.venv/bin/lj-runtime-ctl")
fi
if [[ ${#ctl[@]} -eq 0 ]]; then
  problem "lj-runtime-ctl not found; fix: pip install the lj-runtimekit-proto wheel, or set LJ_RUNTIME_CTL"
elif [[ -S $socket_dir/$socket_name ]]; then
  if info=$("${ctl[@]}" --socket-dir "$socket_dir" --attempts 2 info 2>&1); then
    version=$(grep -oE 'v[0-9]+\.[0-9]+\.[0-9]+' <<<"$info" | head -n 1 || true)
    if [[ $version =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
      major=${BASH_REMATCH[1]} feature=${BASH_REMATCH[2]}
      if (( major > 1 || (major == 1 && feature >= 13) )); then
        ok "Runtime $version >= v1.13.0 (base features)"
        (( major > 1 || feature >= 14 )) || echo "note    Runtime $version: MIG, PPU/AMD devices and per-container metrics need v1.14.0"
        (( major > 1 || feature >= 15 )) || echo "note    Runtime $version: topology-aware gang scheduling needs v1.15.0"
      else
        problem "Runtime $version is older than v1.13.0 (base features); fix: upgrade the Runtime"
      fi
    else
      problem "cannot read a version from lj-runtime-ctl info: $info"
    fi
  else
    problem "the Runtime does not answer on $socket_dir/$socket_name: $(tail -n 1 <<<"$info"); fix: restart the Runtime"
  fi
fi

# 3. kubelet read-only port (optional: the components also read the node's pods from the
#    API server)
fetch() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time 5 "$1"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"
  fi
}
if pods=$(fetch "$kubelet_url" 2>&1) && grep -q '"PodList"' <<<"$pods"; then
  ok "kubelet read-only port answers $kubelet_url with a PodList"
else
  echo "warning kubelet read-only port does not answer $kubelet_url with a PodList ($(tail -n 1 <<<"$pods")): deploy with --no-kubelet-read-only-port (Helm: kubeletReadOnlyPort=false), so the Device Plugin and the Exporter watch their node's pods on the API server; or set readOnlyPort: 10255 in the kubelet configuration"
fi

# 4. device plugin directory
if [[ -S $plugin_dir/kubelet.sock ]]; then
  ok "kubelet device plugin socket $plugin_dir/kubelet.sock"
else
  problem "no kubelet device plugin socket $plugin_dir/kubelet.sock; fix: is the kubelet running with the DevicePlugins feature (pass --plugin-dir)?"
fi

# 5. lj-runtime handler
if [[ -f $containerd_config ]]; then
  if grep -qE 'runtimes\.("?)lj-runtime\1\]' "$containerd_config"; then
    ok "containerd defines the lj-runtime handler ($containerd_config)"
  else
    problem "containerd config $containerd_config has no lj-runtime runtime handler; fix: install the Lingjun Runtime's containerd configuration"
  fi
else
  echo "note    $containerd_config not found: check that the container runtime defines the lj-runtime handler"
fi

if [[ $problems -gt 0 ]]; then
  echo "node-precheck: $problems problem(s)" >&2
  exit 1
fi
echo "node-precheck: passed"
