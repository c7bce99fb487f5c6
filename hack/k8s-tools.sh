#!/usr/bin/env bash
# Provides the pinned Kubernetes tools (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, helm, kueue (the
# Kueue manager, with its CRDs and webhook manifests from the same module
# version in kueue-config/ next to it), and lj-hollow-node: the kubelet with
# the real device manager, from hack/hollow-node), built from the Go module
# proxy into a per-version cache outside the repository:
#   ${LJ_RUNTIMEKIT_CACHE:-$HOME/.cache/lj-runtimekit}/k8s/<K8S_VERSION>/bin
# and the same for K8S_DRA_VERSION, the DRA mode's release: its own
# Kubernetes binaries and lj-hollow-node, with etcd, kwok, helm and kueue
# (and kueue-config) linked from K8S_VERSION's directory.
# Idempotent: a binary that exists and reports the pinned version through its
# version command is kept (lj-hollow-node also needs the hash of its Go
# source, stored next to it; kueue has no version command: the module
# version recorded in the binary is read with `go version -m`). Static
# (CGO_ENABLED=0), -trimpath, stripped.
#
# Usage: hack/k8s-tools.sh            build what is missing, check everything
#        hack/k8s-tools.sh --bin-dir  print the bin directory and exit
#        hack/k8s-tools.sh --check    only check; exit 1 if something is missing
# Versions come from hack/versions.env; K8S_VERSION, K8S_DRA_VERSION,
# ETCD_VERSION, KWOK_VERSION, HELM_VERSION and KUEUE_VERSION in the
# environment override them. K8S_VERSION in the environment provides that
# release alone, all of its tools its own (as `make test-oldest-k8s` does).
# K8S_TOOLS (space-separated names) limits what is provided; the default is
# all, without lj-hollow-node for a Kubernetes minor not in
# HOLLOW_NODE_MINORS (its glue follows each minor's kubelet internals).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
env_k8s=${K8S_VERSION-}
env_dra=${K8S_DRA_VERSION-}
env_etcd=${ETCD_VERSION-}
env_kwok=${KWOK_VERSION-}
env_helm=${HELM_VERSION-}
env_kueue=${KUEUE_VERSION-}
# shellcheck source=/dev/null
. "$root/hack/versions.env"
K8S_VERSION=${env_k8s:-$K8S_VERSION}
K8S_DRA_VERSION=${env_dra:-$K8S_DRA_VERSION}
ETCD_VERSION=${env_etcd:-$ETCD_VERSION}
KWOK_VERSION=${env_kwok:-$KWOK_VERSION}
HELM_VERSION=${env_helm:-$HELM_VERSION}
KUEUE_VERSION=${env_kueue:-$KUEUE_VERSION}

die() { echo "k8s-tools: error: $*" >&2; exit 1; }
log() { echo "k8s-tools: $*" >&2; }

[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] \
  || die "K8S_VERSION must look like v1.34.4, got '$K8S_VERSION'"
k8s_minor=${BASH_REMATCH[1]}
k8s_patch=${BASH_REMATCH[2]}
staging_version="v0.${k8s_minor}.${k8s_patch}"

cache=${LJ_RUNTIMEKIT_CACHE:-$HOME/.cache/lj-runtimekit}
vdir="$cache/k8s/$K8S_VERSION"
bin="$vdir/bin"
src="$vdir/src"

mode=build
case "${1-}" in
  --bin-dir) echo "$bin"; exit 0 ;;
  --check) mode=check ;;
  "") ;;
  -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
  *) die "unknown argument '$1' (try --help)" ;;
esac

# Both pinned releases unless K8S_VERSION came from the environment: this
# one, then the DRA release sharing its etcd, kwok, helm and kueue (K8S_SHARED_BIN,
# set for that second run only).
if [[ -z $env_k8s && $K8S_DRA_VERSION != "$K8S_VERSION" ]]; then
  K8S_VERSION=$K8S_VERSION K8S_SHARED_BIN='' bash "$0" "$@"
  K8S_VERSION=$K8S_DRA_VERSION K8S_SHARED_BIN=$bin exec bash "$0" "$@"
fi
shared_bin=${K8S_SHARED_BIN-}
shared_tools=(etcd kwok helm kueue)

all_tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm kueue lj-hollow-node)
default_tools=("${all_tools[@]}")
if [[ ,$HOLLOW_NODE_MINORS, != *",$k8s_minor,"* ]]; then
  # The glue reaches kubelet internals that change between minors.
  default_tools=("${all_tools[@]:0:8}")
  log "Kubernetes $K8S_VERSION: no lj-hollow-node (its glue follows Kubernetes 1.{$HOLLOW_NODE_MINORS}); the kubelet-backed tests and the sandbox need one of those"
fi
read -r -a tools <<<"${K8S_TOOLS:-${default_tools[*]}}"
for t in "${tools[@]}"; do
  [[ " ${all_tools[*]} " == *" $t "* ]] || die "K8S_TOOLS names '$t'; known: ${all_tools[*]}"
done

# The Go source of lj-hollow-node; its hash is stored next to the binary so
# that a change to the source rebuilds it.
hollow_src="$root/hack/hollow-node"
hollow_hash=$(cat "$hollow_src"/*.go | sha256sum | cut -c1-16)

# Helm's link-time values, as its release build sets them: the Kubernetes
# version that `helm template` and `helm lint` assume without a cluster
# (without them a source build assumes 1.20, below the chart's kubeVersion)
# is the pinned one. Stored next to the binary so that a change rebuilds it.
helm_ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  helm_ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
done

# Kueue's CRDs and webhook manifests, copied from the module at build time:
# kueue-config/crd/*.yaml, kueue-config/webhook/manifests.yaml, and
# kueue-config/VERSION naming the module version they came from.
kueue_config="$bin/kueue-config"

# linked NAME: the tool is a link to K8S_SHARED_BIN's.
linked() { [[ -n $shared_bin && " ${shared_tools[*]} " == *" $1 "* ]]; }

# version_ok NAME: the binary exists and reports the pinned version (a
# linked one: the link is in place; its own release's run checked it).
version_ok() {
  local name=$1 path="$bin/$1" out want
  [[ -x $path ]] || return 1
  if linked "$name"; then
    [[ $(readlink "$path") == "$shared_bin/$name" ]] || return 1
    [[ $name != kueue || $(readlink "$kueue_config") == "$shared_bin/kueue-config" ]]
    return
  fi
  case $name in
    etcd) out=$("$path" --version 2>&1) || return 1; want="etcd Version: ${ETCD_VERSION#v}" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler)
      out=$("$path" --version 2>&1) || return 1; want="Kubernetes $K8S_VERSION" ;;
    kubectl) out=$("$path" version --client 2>&1) || return 1; want="Client Version: $K8S_VERSION" ;;
    kwok) out=$("$path" --version 2>&1) || return 1; want="$KWOK_VERSION" ;;
    kueue)
      [[ $(cat "$kueue_config/VERSION" 2>/dev/null) == "$KUEUE_VERSION" ]] || return 1
      command -v go >/dev/null || return 1
      out=$(go version -m "$path" 2>&1) || return 1; want=$'\tsigs.k8s.io/kueue\t'"$KUEUE_VERSION"$'\t' ;;
    helm)
      [[ $(cat "$path.ldflags" 2>/dev/null) == "$helm_ld" ]] || return 1
      out=$("$path" version --short 2>&1) || return 1; want="$HELM_VERSION" ;;
    lj-hollow-node)
      [[ $(cat "$path.source-sha256" 2>/dev/null) == "$hollow_hash" ]] || return 1
      out=$("$path" --version 2>&1) || return 1; want="Kubernetes $K8S_VERSION" ;;
    *) return 1 ;;
  esac
  [[ $out == *"$want"* ]]
}

missing=()
for t in "${tools[@]}"; do
  if version_ok "$t"; then
    log "ok      $t ($bin/$t)"
  else
    missing+=("$t")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  log "all tools present for Kubernetes $K8S_VERSION in $bin"
  exit 0
fi
if [[ $mode == check ]]; then
  die "missing or wrong version: ${missing[*]} (in $bin); run 'make k8s-tools'"
fi

command -v go >/dev/null || die "Go is needed to build the tools (https://go.dev/dl/); not found on PATH"
mkdir -p "$bin" "$src"

# One build at a time per version (CI and a person may race).
exec 9>"$vdir/.lock"
if command -v flock >/dev/null; then
  log "waiting for the build lock $vdir/.lock" ; flock 9
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"
jobs=${GO_BUILD_JOBS:-2}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
started=$(date +%s)
built=()

need() { local t; for t in "$@"; do [[ " ${missing[*]} " == *" $t "* ]] && ! linked "$t" && return 0; done; return 1; }

# new_module DIR: an empty throwaway module in DIR.
new_module() {
  rm -rf "$1"; mkdir -p "$1"
  (cd "$1" && go mod init "lj-runtimekit.local/k8s-tools/$(basename "$1")" >/dev/null 2>&1)
}

step() { log "[$(( $(date +%s) - started ))s] $*"; }

for t in "${missing[@]}"; do
  if linked "$t"; then
    [[ -x $shared_bin/$t ]] || die "$shared_bin/$t is missing; it is shared with Kubernetes $K8S_VERSION"
    ln -sfn "$shared_bin/$t" "$bin/$t"
    if [[ $t == kueue ]]; then rm -rf "$kueue_config"; ln -s "$shared_bin/kueue-config" "$kueue_config"; fi
    built+=("$t")
    step "linked $t to $shared_bin/$t"
  fi
done

# new_kubernetes_module DIR: a throwaway module in DIR that requires
# k8s.io/kubernetes@$K8S_VERSION with a replace line per staging module
# (k8s.io/api => k8s.io/api v0.MINOR.PATCH, ...): k8s.io/kubernetes's own
# go.mod points them at ./staging, which a dependent module cannot use.
new_kubernetes_module() {
  local m=$1 modfile staging s
  new_module "$m"
  modfile=$(cd "$m" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p') \
    || die "the Go proxy does not serve k8s.io/kubernetes@$K8S_VERSION"
  [[ -n $modfile && -f $modfile ]] || die "no go.mod downloaded for k8s.io/kubernetes@$K8S_VERSION"
  mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$modfile")
  [[ ${#staging[@]} -gt 0 ]] || die "no staging replace lines found in $modfile"
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    for s in "${staging[@]}"; do echo "	$s => $s $staging_version"; done
    echo ")"
  } >>"$m/go.mod"
}

# Version stamps of the Kubernetes builds (--version prints them).
k8s_ld=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
  k8s_ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
done

# record_seconds GROUP SECONDS: build time of one group (etcd, kwok, helm,
# kubernetes) in build-seconds.env; the cold build time is their sum.
record_seconds() {
  local f="$vdir/build-seconds.env"
  touch "$f"
  sed -i "/^$1=/d" "$f"
  echo "$1=$2" >>"$f"
}

# build_one NAME MODULE VERSION PACKAGE LDFLAGS
build_one() {
  local name=$1 module=$2 version=$3 pkg=$4 ld=$5 m="$src/$1" t0
  t0=$(date +%s)
  step "resolving $module@$version"
  new_module "$m"
  (cd "$m" && go get "$pkg@$version") || die "go get $pkg@$version failed (see above)"
  step "go build -p $jobs $pkg"
  (cd "$m" && go build -p "$jobs" -trimpath -ldflags "-s -w $ld" -o "$bin/$name" "$pkg") \
    || die "go build of $pkg@$version failed (see above)"
  built+=("$name")
  record_seconds "$name" $(( $(date +%s) - t0 ))
  step "built $name"
}

if need etcd; then
  build_one etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3 ""
fi
if need kwok; then
  build_one kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$K8S_VERSION"
fi
if need helm; then
  build_one helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$helm_ld"
  echo "$helm_ld" >"$bin/helm.ldflags"
fi
if need kueue; then
  build_one kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue \
    "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.BuildDate=$build_date"
  kueue_src=$(cd "$src/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue) \
    || die "no module directory for sigs.k8s.io/kueue@$KUEUE_VERSION"
  rm -rf "$kueue_config"
  mkdir -p "$kueue_config/crd" "$kueue_config/webhook"
  cp "$kueue_src"/config/components/crd/bases/*.yaml "$kueue_config/crd/"
  cp "$kueue_src/config/components/webhook/manifests.yaml" "$kueue_config/webhook/"
  chmod -R u+w "$kueue_config"
  echo "$KUEUE_VERSION" >"$kueue_config/VERSION"
  step "copied Kueue's CRDs and webhook manifests to $kueue_config"
fi

if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  t0=$(date +%s)
  step "resolving k8s.io/kubernetes@$K8S_VERSION (staging modules at $staging_version)"
  m="$src/kubernetes"
  new_kubernetes_module "$m"
  k8s_pkgs=()
  for t in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    need "$t" && k8s_pkgs+=("k8s.io/kubernetes/cmd/$t")
  done
  step "go get ${k8s_pkgs[*]} at $K8S_VERSION"
  (cd "$m" && go get "${k8s_pkgs[@]/%/@$K8S_VERSION}") || die "go get of Kubernetes $K8S_VERSION failed (see above)"
  ld="-s -w$k8s_ld"
  step "go build -p $jobs ${k8s_pkgs[*]} (the long part: about 15 minutes on 2 cores from a cold Go cache)"
  (cd "$m" && go build -p "$jobs" -trimpath -ldflags "$ld" -o "$bin/" "${k8s_pkgs[@]}") \
    || die "go build of Kubernetes $K8S_VERSION failed (see above)"
  for p in "${k8s_pkgs[@]}"; do built+=("${p##*/}"); done
  record_seconds kubernetes $(( $(date +%s) - t0 ))
  step "built ${k8s_pkgs[*]##*/}"
fi

# lj-hollow-node: hack/hollow-node/*.go (package main) in a throwaway module
# made like the one above. -checklinkname=0: the glue reaches the device
# manager's unexported constructor through go:linkname (see devices.go).
if need lj-hollow-node; then
  t0=$(date +%s)
  m="$src/lj-hollow-node"
  step "resolving lj-hollow-node (hack/hollow-node) against k8s.io/kubernetes@$K8S_VERSION"
  new_kubernetes_module "$m"
  # Only this minor's kubelet_1_<minor>.go: go mod tidy reads every build tag's
  # imports, and another minor's would move this one's dependencies.
  cp "$hollow_src"/*.go "$m/"
  find "$m" -name 'kubelet_1_*.go' ! -name "kubelet_1_$k8s_minor.go" -delete
  (cd "$m" && go mod tidy) || die "go mod tidy for lj-hollow-node failed (see above)"
  # The build tag k8s_1_<minor> picks the files of that minor's kubelet internals.
  step "go build -p $jobs lj-hollow-node (about 3 minutes on 2 cores from a cold Go build cache; seconds when only hack/hollow-node changed)"
  (cd "$m" && go build -p "$jobs" -tags "k8s_1_$k8s_minor" -trimpath -ldflags "-s -w -checklinkname=0$k8s_ld" -o "$bin/lj-hollow-node" .) \
    || die "go build of lj-hollow-node failed (see above)"
  echo "$hollow_hash" >"$bin/lj-hollow-node.source-sha256"
  built+=(lj-hollow-node)
  record_seconds lj-hollow-node $(( $(date +%s) - t0 ))
  step "built lj-hollow-node"
fi


elapsed=$(( $(date +%s) - started ))
failed=()
for t in "${tools[@]}"; do
  if version_ok "$t"; then log "ok      $t"; else failed+=("$t"); fi
done
[[ ${#failed[@]} -eq 0 ]] || die "built but the version check failed for: ${failed[*]} (expected Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION, kueue $KUEUE_VERSION)"

# Build record, read by the benchmark: cold_build_s is the sum of the group
# times in build-seconds.env (each group's first build, from an empty cache).
cold=0
touch "$vdir/build-seconds.env"  # empty when only links were made
while IFS='=' read -r _ secs; do cold=$(( cold + secs )); done <"$vdir/build-seconds.env"
cat >"$vdir/build-record.json" <<JSON
{"k8s_version": "$K8S_VERSION", "cold_build_s": $cold, "last_run_built": "${built[*]}", "last_run_s": $elapsed, "date": "$build_date", "go": "$(go env GOVERSION)", "cpus": $(nproc)}
JSON
log "built ${built[*]} in ${elapsed}s; cold build total ${cold}s; all tools present for Kubernetes $K8S_VERSION in $bin"
