#!/usr/bin/env bash
# Switches the project to another Kubernetes version:
#   1. checks the version (vMAJOR.MINOR.PATCH, known to the Go module proxy);
#   2. pins the Python `kubernetes` client to the matching release line
#      (client major N <=> Kubernetes 1.N) in every workspace pyproject.toml
#      that depends on it;
#   3. sets K8S_VERSION in hack/versions.env;
#   4. refreshes uv.lock (uv lock);
#   5. provides that version's binaries (hack/k8s-tools.sh) and runs make build.
# On a failure in steps 2-4 the edited files are restored.
#
# Usage: hack/download-deps.sh [--skip-tools] <k8s-version>
#   --skip-tools   stop after the pin and the lock (no binaries, no make build)
set -euo pipefail

self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

die() { echo "download-deps: error: $*" >&2; exit 1; }
usage() { sed -n '2,14p' "$self" | sed 's/^# \{0,1\}//' >&2; exit 2; }

skip_tools=0
version=""
for arg in "$@"; do
  case $arg in
    --skip-tools) skip_tools=1 ;;
    -h|--help) usage ;;
    -*) echo "download-deps: error: unknown option '$arg'" >&2; usage ;;
    *) [[ -z $version ]] || die "one version only (got '$version' and '$arg')"; version=$arg ;;
  esac
done
[[ -n $version ]] || usage

# 1. Format, then existence.
[[ $version =~ ^v?1\.([0-9]|[1-9][0-9]+)\.([0-9]|[1-9][0-9]+)$ ]] \
  || die "malformed Kubernetes version '$version': expected v1.MINOR.PATCH, e.g. v1.34.4"
version="v${version#v}"
minor=${BASH_REMATCH[1]}
oldest=$(sed -n 's/^K8S_OLDEST_VERSION=v1\.\([0-9]*\)\..*/\1/p' hack/versions.env)
(( minor >= oldest )) \
  || die "Kubernetes $version is too old: the oldest supported is 1.$oldest (docs/compatibility.md)"
command -v go >/dev/null || die "Go is needed to look the version up on the Go module proxy"
if ! out=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go list -m "k8s.io/kubernetes@$version" 2>&1); then
  reason=${out##*$'\n'}
  die "unknown Kubernetes version $version: the Go module proxy does not serve k8s.io/kubernetes@$version (${reason#"${reason%%[![:space:]]*}"})"
fi

# 2-4 with a rollback.
# Every workspace member (root pyproject.toml) whose pyproject pins the client.
mapfile -t members < <(python3 -c 'import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["tool"]["uv"]["workspace"]["members"]))')
pyprojects=()
for m in "${members[@]}"; do
  if grep -q -E '^[[:space:]]*"kubernetes[<>=~!, 0-9.]*"' "$m/pyproject.toml" 2>/dev/null; then
    pyprojects+=("$m/pyproject.toml")
  fi
done
[[ ${#pyprojects[@]} -gt 0 ]] || die "no pyproject.toml depends on the kubernetes client"
files=("${pyprojects[@]}" hack/versions.env uv.lock)
backup=$(mktemp -d)
for f in "${files[@]}"; do mkdir -p "$backup/$(dirname "$f")"; cp -p "$f" "$backup/$f"; done
restore() {
  for f in "${files[@]}"; do cp -p "$backup/$f" "$f"; done
  echo "download-deps: restored ${files[*]}" >&2
}
trap 'rm -rf "$backup"' EXIT

pin="kubernetes>=${minor},<$(( minor + 1 ))"
for f in "${pyprojects[@]}"; do
  sed -i -E "s/^([[:space:]]*)\"kubernetes[<>=~!, 0-9.]*\"/\1\"${pin}\"/" "$f"
  echo "download-deps: $f: $pin"
done
sed -i -E "s/^K8S_VERSION=.*/K8S_VERSION=${version}/" hack/versions.env
echo "download-deps: hack/versions.env: K8S_VERSION=$version"

echo "download-deps: uv lock"
if ! uv lock 2>&1; then
  restore
  die "uv lock failed for $pin: is there a Python kubernetes client ${minor}.x on PyPI?"
fi
locked=$(awk '/^name = "kubernetes"$/ { getline; print $3 }' uv.lock | tr -d '"')
[[ $locked == "${minor}."* ]] || { restore; die "uv.lock has kubernetes '$locked', expected ${minor}.x"; }
echo "download-deps: uv.lock: kubernetes $locked"

if (( skip_tools )); then
  echo "download-deps: --skip-tools: not building binaries, not running make build"
  exit 0
fi

# 5. Binaries and build.
bash hack/k8s-tools.sh
make build
echo "download-deps: the project now uses Kubernetes $version (Python client $locked)"
