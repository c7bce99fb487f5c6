#!/usr/bin/env bash
# Deploys and operates the LJ Runtime Kit components.
#
# Usage: deploy/deploy-all.sh COMMAND [options]
#
# Commands:
#   precheck                 cluster reachable, Kubernetes >= 1.28 (>= 1.30 for the
#                            admission policies), RuntimeClass, JobSet CRD (when gang
#                            scheduling needs it), labelled nodes, kubectl within one
#                            minor of the server, Pod Security privileged where the
#                            node agents and the Job Agent run, the extender's Secrets
#   deploy                   render and apply every object (server-side apply), wait for rollout;
#                            your edits of the files under deploy/<component>/ are applied
#                            (an option setting the same field wins, with a warning)
#   status                   workloads, ready counts, images, pods and their nodes
#   verify                   pods Running+ready, node capacity = device count, exporter
#                            metrics, protocol ConfigMaps agree, no stale resources
#   upgrade --version=V      set the images to V, wait for the rollout, report old -> new
#   rollback                 undo the last deploy or upgrade: configuration and workloads
#   delete                   disable the Runtime features of the enabled nodes (the
#                            Controller's disable Jobs), remove every object deploy
#                            created, the Leases and the Runtime Kit's node labels
#                            and annotations
#   cleanup-stale-resources  remove old protocol resource names from node status
#
# Options:
#   --components=LIST   device-plugin,scheduler-framework,exporter,controller (default: all)
#   --namespace=NS      default kube-system
#   --jobs-namespace=NS the Controller's Jobs, a namespace of their own; default
#                       lj-runtimekit-jobs
#   --registry=REG      default lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit
#   --version=V         v{major}.{feature}.{iteration}; default the VERSION file
#   --image=C=REF       image of one component (device-plugin, scheduler-framework,
#                       exporter, controller, job-agent); repeatable
#   --no-kubelet-read-only-port
#                       the Device Plugin and the Exporter watch their node's pods
#                       on the API server instead of reading the kubelet's port 10255
#   --no-admission-policies
#                       leave out the ValidatingAdmissionPolicies (required below
#                       Kubernetes 1.30: RBAC alone then bounds the components)
#   --dra               DRA mode (Kubernetes >= 1.34): also the DRA kubelet plugin, on
#                       the nodes labelled lingjun.com/device-api=dra (the Device Plugin
#                       leaves them), and the driver's DeviceClasses; precheck checks the
#                       version, resource.k8s.io/v1 and the alpha DRA gates; delete also
#                       removes the driver's ResourceSlices (found without the flag too)
#   --dra-extended-resources
#                       with --dra: the whole-device DeviceClasses name their extended
#                       resource (the DRAExtendedResource gate)
#   --dra-mig-profiles=P1,P2,...
#                       with --dra-extended-resources: the MIG profiles whose DeviceClass
#                       names <mig prefix>/mig-<profile> (default NVIDIA's profiles of
#                       A30, A100, H100, H200; empty: none)
#   --extender          the scheduler as an extender of the cluster's kube-scheduler:
#                       it serves TLS on a Service, and the kube-scheduler's
#                       configuration is rendered into a ConfigMap (deploy/README.md)
#   --extender-tls-secret=NAME
#                       with --extender: kubernetes.io/tls Secret of the extender
#   --extender-client-ca-secret=NAME
#                       with --extender: Secret with ca.crt, the CA of the callers'
#                       client certificates (what the kube-scheduler sends)
#   --extender-token-secret=NAME
#                       with --extender: Secret with token, the callers' bearer token
#   --dry-run           server-side dry run: validate and show, change nothing
#   --kubeconfig=FILE   default $KUBECONFIG, then ~/.kube/config
#   --timeout=DURATION  rollout wait and delete's wait for disabled nodes, default 300s
#   --keep-node-state   delete: leave the nodes as they are (no disable, labels and
#                       annotations kept), e.g. when the Controller is already gone
#   --metrics-url=URL   verify: read the exporter metrics here (e.g. a port-forward)
#                       instead of through the API server proxy
#   --metrics-url=POD=URL
#                       verify: read the /metrics of pod POD (scheduler or exporter)
#                       here; repeatable. With any --metrics-url the proxy is not used
#   --keep-live-config  deploy: keep the live data of protocol/config ConfigMaps edited
#                       since the last deploy (kubectl edit) and render the workloads
#                       (nodeSelector, tolerations, label key) from their protocol.yaml
#   --overwrite-config  deploy: replace such edited ConfigMaps with deploy/protocol.yaml
#                       and the defaults (rollback restores an edit the pods ran)
#
# Environment: KUBECTL (kubectl binary), LJ_DEPLOY_PYTHON (Python with the
# lj-runtimekit-deploy helper installed), LJ_DEPLOY_LOG_DIR (log directory).
# Every operation is logged with timestamps to a file whose path is printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

op=""
components=""
namespace="kube-system"
jobs_namespace="lj-runtimekit-jobs"
kubelet_port=true
admission=true
dra=false
extender_args=()
dra_args=()
registry="lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit"
version=""
images=()
dry_run=false
kubeconfig="${KUBECONFIG:-}"
timeout="300s"
metrics_url=""
pod_metrics=()
keep_node_state=false
live_config=ask

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

# -- logging ----------------------------------------------------------------------------------

log_dir="${LJ_DEPLOY_LOG_DIR:-$root/_output/deploy-logs}"
log_file=""

ts() { date -u +%Y-%m-%dT%H:%M:%SZ; }

log() {
  local line
  line="$(ts) [${op:-deploy-all}] $*"
  echo "$line"
  if [[ -n $log_file ]]; then echo "$line" >>"$log_file"; fi
}

die() {
  local line
  line="$(ts) [${op:-deploy-all}] error: $*"
  echo "$line" >&2
  if [[ -n $log_file ]]; then
    echo "$line" >>"$log_file"
    echo "log: $log_file" >&2
  fi
  exit 1
}

start_log() {
  mkdir -p "$log_dir" || die "cannot create the log directory $log_dir; set LJ_DEPLOY_LOG_DIR"
  log_file="$log_dir/deploy-all-$op-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
  : >"$log_file" || die "cannot write the log file $log_file; set LJ_DEPLOY_LOG_DIR"
  log "log file: $log_file"
  log "command: $0 ${original_args[*]}"
}

# run CMD...: runs a command, its output shown and logged; returns its status.
run() {
  log "\$ $*"
  "$@" 2>&1 | tee -a "$log_file"
  return "${PIPESTATUS[0]}"
}

# -- arguments --------------------------------------------------------------------------------

original_args=("$@")
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help|help) usage; exit 0 ;;
    --components=*) components=${1#*=} ;;
    --namespace=*) namespace=${1#*=} ;;
    --jobs-namespace=*) jobs_namespace=${1#*=} ;;
    --no-kubelet-read-only-port) kubelet_port=false ;;
    --no-admission-policies) admission=false ;;
    --dra) dra=true ;;
    --dra-extended-resources|--dra-mig-profiles=*) dra_args+=("$1") ;;
    --extender|--extender-tls-secret=*|--extender-client-ca-secret=*|--extender-token-secret=*)
      extender_args+=("$1") ;;
    --registry=*) registry=${1#*=} ;;
    --version=*) version=${1#*=} ;;
    --image=*) images+=("${1#*=}") ;;
    --dry-run) dry_run=true ;;
    --kubeconfig=*) kubeconfig=${1#*=} ;;
    --timeout=*) timeout=${1#*=} ;;
    --metrics-url=*)
      value=${1#*=}
      if [[ $value =~ ^[a-z0-9][-a-z0-9.]*=https?:// ]]; then pod_metrics+=("$value"); else metrics_url=$value; fi ;;
    --keep-live-config)
      [[ $live_config != overwrite ]] || die "--keep-live-config and --overwrite-config: choose one"
      live_config=keep ;;
    --overwrite-config)
      [[ $live_config != keep ]] || die "--keep-live-config and --overwrite-config: choose one"
      live_config=overwrite ;;
    --keep-node-state) keep_node_state=true ;;
    --components|--namespace|--jobs-namespace|--registry|--version|--image|--kubeconfig|--timeout|--metrics-url|--extender-tls-secret|--extender-client-ca-secret|--extender-token-secret)
      die "$1 needs a value: write $1=VALUE" ;;
    -*) die "unknown option '$1' (see $0 --help)" ;;
    *)
      [[ -z $op ]] || die "one command at a time: got '$op' and '$1' (see $0 --help)"
      op=$1 ;;
  esac
  shift
done

case $op in
  precheck|deploy|status|verify|upgrade|rollback|delete|cleanup-stale-resources) ;;
  "") usage >&2; die "no command given" ;;
  *) die "unknown command '$op'; commands: precheck deploy status verify upgrade rollback delete cleanup-stale-resources" ;;
esac

[[ $timeout =~ ^[1-9][0-9]*(s|m|h)$ ]] || die "--timeout=$timeout: expected a duration like 300s, 10m or 1h"

start_log

# -- the helper (rendering and checks) ---------------------------------------------------------

if [[ -n ${LJ_DEPLOY_PYTHON:-} ]]; then
  py=$LJ_DEPLOY_PYTHON
elif [[ -x $root/.venv/bin/python ]]; then
  py=$root/.venv/bin/python
else
  py=$(command -v python3 || true)
fi
[[ -n $py ]] || die "python3 not found; install Python >= 3.11"

helper() { "$py" -m lj_runtimekit.deploy "$@"; }

protocol="$here/protocol.yaml"
work=$(mktemp -d "${TMPDIR:-/tmp}/lj-deploy.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [[ $op == upgrade && -z $version ]]; then
  die "upgrade needs --version=v{major}.{feature}.{iteration} (the version to upgrade to)"
fi
if [[ -z $version ]]; then
  version=$(tr -d '[:space:]' <"$root/VERSION")
fi
image_args=()
for image in ${images[@]+"${images[@]}"}; do image_args+=("--image=$image"); done
image_args+=("--jobs-namespace=$jobs_namespace")
$kubelet_port || image_args+=(--no-kubelet-read-only-port)
$admission || image_args+=(--no-admission-policies)
image_args+=(${extender_args[@]+"${extender_args[@]}"})
image_args+=(${dra_args[@]+"${dra_args[@]}"})
$dra && image_args+=(--dra)
[[ -f $protocol ]] || die "$protocol is missing (the one source of protocol.yaml)"

render() {
  helper render --protocol="$protocol" --components="$components" --namespace="$namespace" \
    --registry="$registry" --version="$version" \
    ${image_args[@]+"${image_args[@]}"} "$@"
}

# render_applied ARGS...: what deploy and upgrade apply: the objects rendered with the options
# and the operator's edits of the files under deploy/<component>/ (each edit logged, applied
# or overridden by an option); dies with the helper's one line.
render_applied() {
  local line
  render --deploy-dir="$here" "$@" >"$work/render.out" 2>"$work/render.err" \
    || die "$(sed 's/^error: //' "$work/render.err")"
  while IFS= read -r line; do log "$line"; done <"$work/render.out"
}

# One helper call checks every option (components, version, images, protocol.yaml; for
# deploy and upgrade the edited files under deploy/) before the cluster is contacted, and
# says what the rest of the script needs.
edited_files=()
[[ $op != deploy && $op != upgrade ]] || edited_files=("--deploy-dir=$here")
if ! out=$(helper preflight --protocol="$protocol" --components="$components" \
  --namespace="$namespace" --registry="$registry" --version="$version" \
  ${image_args[@]+"${image_args[@]}"} ${edited_files[@]+"${edited_files[@]}"} 2>&1); then
  if [[ $out == *"No module named"*lj_runtimekit* ]]; then
    die "the deploy helper is not installed for $py: run 'make sync' in $root (or pip install $root/proto $root/deploy), or set LJ_DEPLOY_PYTHON"
  fi
  die "${out#error: }"
fi
selected=()
enable_label=""
exporter_port=""
scheduler_port=""
gang=not-required
min_jobset=""
device_api_label=""
dra_driver=""
dra_resource=""
while read -r key rest; do
  case $key in
    component) selected+=("$rest") ;;
    enable-label) enable_label=$rest ;;
    exporter-port) exporter_port=$rest ;;
    scheduler-port) scheduler_port=$rest ;;
    jobset) read -r gang min_jobset <<<"$rest" ;;
    device-api-label) device_api_label=$rest ;;
    dra-driver) dra_driver=$rest ;;
    dra-plugin) dra_resource=$rest ;;
  esac
done <<<"$out"
names=()
for line in "${selected[@]}"; do names+=("${line%% *}"); done
all_selected=false
[[ ${#names[@]} -eq 4 ]] && all_selected=true
log "components: ${names[*]}; namespace $namespace; version $version; dry-run $dry_run"

# -- kubectl and the cluster ------------------------------------------------------------------

kubectl_bin=${KUBECTL:-kubectl}
command -v "$kubectl_bin" >/dev/null 2>&1 \
  || die "kubectl not found ('$kubectl_bin'): install kubectl (https://kubernetes.io/docs/tasks/tools/) or set KUBECTL=/path/to/kubectl"
kc=("$kubectl_bin")
# KUBECONFIG may list several files (a:b); kubectl reads that itself. One file is checked.
if [[ -n $kubeconfig && ( $kubeconfig != *:* || $kubeconfig != "${KUBECONFIG:-}" ) ]]; then
  problem=""
  if [[ ! -e $kubeconfig ]]; then problem="does not exist"
  elif [[ -d $kubeconfig ]]; then problem="is a directory, not a kubeconfig file"
  elif [[ ! -f $kubeconfig ]]; then problem="is not a regular file (a device or a pipe), so it holds no cluster"
  elif [[ ! -r $kubeconfig ]]; then problem="cannot be read (permissions)"
  elif [[ ! -s $kubeconfig ]]; then problem="is empty: it names no cluster"
  fi
  [[ -z $problem ]] || die "kubeconfig $kubeconfig $problem; fix: --kubeconfig=FILE or KUBECONFIG=FILE naming your cluster's kubeconfig"
  kc+=("--kubeconfig=$kubeconfig")
fi
kcn=("${kc[@]}" "--namespace=$namespace")

if ! "${kc[@]}" version -o json --request-timeout=15s >"$work/version.json" 2>"$work/version.err"; then
  server=$("${kc[@]}" config view --minify -o 'jsonpath={.clusters[0].cluster.server}' 2>/dev/null || true)
  cat "$work/version.err" >>"$log_file"
  reason=$(grep -v '^\s*$' "$work/version.err" | tail -n 1 || true)
  die "cannot reach the cluster${server:+ at $server} (kubeconfig ${kubeconfig:-default}): ${reason:-no answer}; fix: check --kubeconfig/KUBECONFIG, the network and that the API server runs"
fi
server_version=$(sed -n '/"serverVersion"/,/}/s/.*"gitVersion": *"\([^"]*\)".*/\1/p' "$work/version.json")
[[ $server_version =~ ^v([0-9]+)\.([0-9]+) ]] || die "cannot read the server version from kubectl version (got '$server_version')"
# The oldest supported release (docs/compatibility.md; K8S_OLDEST_VERSION in hack/versions.env).
oldest_minor=28
if (( BASH_REMATCH[1] == 1 && BASH_REMATCH[2] < oldest_minor )); then
  die "Kubernetes $server_version is older than 1.$oldest_minor, the oldest supported (docs/compatibility.md); fix: upgrade the cluster"
fi
log "Kubernetes $server_version >= 1.$oldest_minor"
# ValidatingAdmissionPolicy v1 and the node name in pod-bound ServiceAccount tokens: 1.30.
policies_served=true
if (( BASH_REMATCH[1] == 1 && BASH_REMATCH[2] < 30 )); then policies_served=false; fi
# DRA mode: resource.k8s.io/v1 (1.34).
dra_served=true
if (( BASH_REMATCH[1] == 1 && BASH_REMATCH[2] < 34 )); then dra_served=false; fi
if ! $policies_served && [[ $op == delete ]]; then
  image_args+=(--no-admission-policies)  # none can exist there
fi

rollout_failed=()
dry_flags=()
$dry_run && dry_flags=(--dry-run=server)

resource_of() { # NAME -> ds/... or deploy/...
  local line
  for line in "${selected[@]}"; do
    if [[ ${line%% *} == "$1" ]]; then read -r _ _ _ res _ <<<"$line"; echo "$res"; return; fi
  done
}

images_of() { # RESOURCE -> container=image ...
  "${kcn[@]}" get "$1" -o 'jsonpath={range .spec.template.spec.containers[*]}{.name}={.image} {end}' 2>/dev/null || true
}

snapshot() {
  local selector="app.kubernetes.io/part-of=lj-runtimekit"
  "${kcn[@]}" get daemonsets,deployments -l "$selector" -o json >"$work/workloads.json" \
    || die "cannot list the workloads in namespace $namespace"
  "${kcn[@]}" get pods -l "$selector" -o json >"$work/pods.json" || die "cannot list the pods"
  # The managed fields' times say when each ConfigMap's data last changed (verify).
  "${kcn[@]}" get configmaps -l "$selector" -o json --show-managed-fields >"$work/configmaps.json" \
    || die "cannot list the ConfigMaps"
  "${kc[@]}" get nodes -o json >"$work/nodes.json" || die "cannot list the nodes"
  if $dra; then
    "${kc[@]}" get deviceclasses -l app=lj-runtimekit-dra-plugin -o json >"$work/deviceclasses.json" \
      || die "cannot list the DeviceClasses (DRA mode)"
    "${kc[@]}" get resourceslices --field-selector="spec.driver=$dra_driver" --show-managed-fields -o json \
      >"$work/resourceslices.json" || die "cannot list the ResourceSlices of driver $dra_driver"
  fi
}

# create_namespace NS: a namespace labelled as the Runtime Kit's (delete removes it).
create_namespace() {
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels:\n    app.kubernetes.io/part-of: lj-runtimekit\n' \
    "$1" >"$work/namespace.yaml"
  run "${kc[@]}" apply --server-side --field-manager=lj-runtimekit-deploy -f "$work/namespace.yaml" \
    || die "cannot create namespace $1"
}

namespace_exists() { "${kc[@]}" get namespace "$namespace" -o name >/dev/null 2>&1; }

# The cluster-scoped objects (ClusterRoles and their bindings, policies, RuntimeClass,
# PriorityClass) have fixed names: one install per cluster owns them. Prints the
# namespace(s) of another install, comma-separated, read from the ClusterRoleBindings' subjects.
other_installs() {
  "${kc[@]}" get clusterrolebindings -l app.kubernetes.io/part-of=lj-runtimekit \
    -o 'jsonpath={range .items[*]}{range .subjects[*]}{.namespace}{"\n"}{end}{end}' 2>/dev/null \
    | sort -u | grep -vx -e "$namespace" -e '' | paste -sd, - || true
}

configmap_names() { # the selected components' ConfigMaps, comma-separated
  local line cms=()
  for line in "${selected[@]}"; do read -r _ _ _ _ cm _ <<<"$line"; cms+=("$cm"); done
  (IFS=,; echo "${cms[*]}")
}

# fetch_live: the live ConfigMaps (with their managed fields' times), workloads and pods into
# $work/cm-live.json, workloads-live.json, pods-live.json.
fetch_live() {
  "${kcn[@]}" get configmaps -l app.kubernetes.io/part-of=lj-runtimekit -o json --show-managed-fields \
    >"$work/cm-live.json" || die "cannot list the ConfigMaps in namespace $namespace"
  "${kcn[@]}" get daemonsets,deployments -l app.kubernetes.io/part-of=lj-runtimekit -o json >"$work/workloads-live.json" \
    || die "cannot list the workloads in namespace $namespace"
  "${kcn[@]}" get pods -l app.kubernetes.io/part-of=lj-runtimekit -o json >"$work/pods-live.json" \
    || die "cannot list the pods in namespace $namespace"
}

# save_config: records the live data of the selected ConfigMaps that a deploy changes (when
# their pods run it: rolled by deploy, or restarted after an edit) on each (annotation
# lj-runtimekit.io/previous-data), for rollback.
save_config() { # [--manifests=FILE] (deploy: what it applies)
  local name patch
  fetch_live
  while read -r name patch; do
    [[ -n $name ]] || continue
    "${kcn[@]}" patch configmap "$name" --type=merge --field-manager=lj-runtimekit-history \
      -p "$patch" >>"$log_file" 2>&1 || die "cannot record the configuration of ConfigMap $namespace/$name (needs configmaps patch rights)"
  done < <(helper config-save --configmaps="$work/cm-live.json" --workloads="$work/workloads-live.json" \
    --pods="$work/pods-live.json" \
    --components="$components" --names="$(configmap_names)" "$@")
  log "recorded the current configuration for rollback"
}

# The revision of each workload that the last deploy or upgrade started from, recorded on
# its component's ConfigMap (an annotation on a Deployment would bump its generation and be
# copied to its ReplicaSets): rollback returns there, and leaves alone a workload the change
# did not touch (`kubectl rollout undo` alone goes one revision back from wherever it is).
# Its own field manager, so that the time of a data change stays readable (verify).
rollback_key='lj-runtimekit.io/rollback-revision'

configmap_of() { # NAME -> its component's ConfigMap
  local line
  for line in "${selected[@]}"; do
    if [[ ${line%% *} == "$1" ]]; then read -r _ _ _ _ cm _ <<<"$line"; echo "$cm"; return; fi
  done
}

revision_of() { # RESOURCE -> its current rollout revision (0: none)
  { "${kcn[@]}" rollout history "$1" 2>/dev/null || true; } \
    | awk '$1 ~ /^[0-9]+$/ && $1 + 0 > r { r = $1 + 0 } END { print r + 0 }'
}

rollback_point_of() { # NAME -> the revision recorded for it ('' none)
  "${kcn[@]}" get configmap "$(configmap_of "$1")" \
    -o "jsonpath={.metadata.annotations.${rollback_key//./\\.}}" 2>/dev/null || true
}

set_rollback_point() { # NAME REVISION
  "${kcn[@]}" annotate --overwrite --field-manager=lj-runtimekit-rollback-point \
    configmap "$(configmap_of "$1")" "$rollback_key=$2" >>"$log_file" 2>&1 \
    || die "cannot record on ConfigMap $(configmap_of "$1") the revision $2 of $1 that rollback returns to (see $log_file)"
}

# note_revisions (before deploy or upgrade applies) and record_rollback_points (after its
# rollouts, finished or not): a workload whose revision moved records the one it left; one
# that did not move drops an older record (rollback undoes the last change only), as a
# ConfigMap records its data only when a deploy changes it.
revisions_before=()
note_revisions() {
  local name
  revisions_before=()
  for name in "${names[@]}"; do revisions_before+=("$(revision_of "$(resource_of "$name")")"); done
}
record_rollback_points() {
  local name rev i=0
  for name in "${names[@]}"; do
    rev=${revisions_before[$i]}
    i=$((i + 1))
    if [[ $rev -gt 0 && $(revision_of "$(resource_of "$name")") != "$rev" ]]; then
      set_rollback_point "$name" "$rev"
    elif [[ -n $(rollback_point_of "$name") ]]; then
      "${kcn[@]}" annotate --field-manager=lj-runtimekit-rollback-point \
        configmap "$(configmap_of "$name")" "$rollback_key-" >>"$log_file" 2>&1 \
        || die "cannot drop the older rollback revision of $name from ConfigMap $(configmap_of "$name") (see $log_file)"
    fi
  done
}

# wait_rollouts NAME...: waits for the rollouts in parallel; returns the names that failed.
wait_rollouts() {
  local name res pids=() failed=() i=0
  for name in "$@"; do
    res=$(resource_of "$name")
    log "\$ kubectl rollout status $res --timeout=$timeout"
    "${kcn[@]}" rollout status "$res" --timeout="$timeout" >"$work/rollout-$name.log" 2>&1 &
    pids+=($!)
  done
  for name in "$@"; do
    if ! wait "${pids[$i]}"; then failed+=("$name"); fi
    tee -a "$log_file" <"$work/rollout-$name.log"
    i=$((i + 1))
  done
  rollout_failed=("${failed[@]+"${failed[@]}"}")
  [[ ${#failed[@]} -eq 0 ]]
}

# -- commands ---------------------------------------------------------------------------------

# minor_of GITVERSION: prints the minor of a v1.MINOR.x version; fails for anything else.
minor_of() {
  [[ $1 =~ ^v1\.([0-9]+)\. ]] || return 1
  echo "${BASH_REMATCH[1]}"
}

# skew_line CLIENT SERVER: the precheck line about kubectl's version against the server's
# (kubectl supports the server's minor and one either side).
skew_line() {
  local client_minor server_minor skew
  if ! client_minor=$(minor_of "$1") || ! server_minor=$(minor_of "$2"); then
    echo "warning: cannot compare kubectl's version '${1:-unknown}' with the server's '$2'; kubectl supports one minor version either side of the server"
    return
  fi
  skew=$((client_minor - server_minor))
  if (( skew > 1 || skew < -1 )); then
    echo "warning: kubectl $1 is ${skew#-} minor versions $( ((skew > 0)) && echo newer || echo older) than the server $2; kubectl supports one minor either side (1.$((server_minor - 1)) to 1.$((server_minor + 1))): deploy may fail or apply objects wrongly; fix: use a kubectl in that range (KUBECTL=/path/to/kubectl)"
  else
    echo "ok      kubectl $1 against the server $2: within one minor"
  fi
}

# pod_security_line NAMESPACE WHAT: a PROBLEM line when the namespace enforces a Pod Security
# level below privileged, which the hostPath volumes of WHAT need; nothing when it is fine.
pod_security_line() {
  local level label=pod-security.kubernetes.io/enforce
  level=$("${kc[@]}" get namespace "$1" -o "jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}" 2>/dev/null) || return 0
  case $level in
    baseline|restricted)
      echo "PROBLEM namespace $1 enforces Pod Security '$level' (label $label=$level), but $2 mount host paths, which only 'privileged' admits; fix: kubectl label --overwrite namespace $1 $label=privileged" ;;
    *) echo "ok      namespace $1: Pod Security enforce '${level:-not set (the cluster default)}'; $2 need 'privileged'" ;;
  esac
}

dra_nodes() { # the nodes labelled for DRA mode, comma-separated
  "${kc[@]}" get nodes -l "$device_api_label=dra" -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null \
    | paste -sd, - || true
}

# dra_line: when DRA mode is asked for (--dra, or a node labelled for it), one line: ok, or
# the PROBLEM that stops it (the version, resource.k8s.io/v1, the alpha DRA gates, a node
# labelled without --dra); nothing otherwise.
dra_line() {
  local nodes why gates
  nodes=$(dra_nodes)
  $dra || [[ -n $nodes ]] || return 0
  why="DRA mode (node(s) $nodes labelled $device_api_label=dra)"
  $dra && why="DRA mode (--dra)"
  if ! $dra_served; then
    echo "PROBLEM $why needs Kubernetes >= 1.34 (resource.k8s.io/v1); the server is $server_version; fix: upgrade the cluster${nodes:+, or remove the label (kubectl label node <node> $device_api_label-)}"
    return
  fi
  if ! "${kc[@]}" get --raw /apis/resource.k8s.io/v1 >/dev/null 2>&1; then
    echo "PROBLEM $why: the API server does not serve resource.k8s.io/v1 (DeviceClass, ResourceSlice); fix: enable it (kube-apiserver --runtime-config=resource.k8s.io/v1=true)"
    return
  fi
  helper dra-probe --protocol="$protocol" --server-minor="$(minor_of "$server_version")" >"$work/dra-probe.yaml" 2>&1 \
    || { echo "PROBLEM $why: $(sed 's/^error: //' "$work/dra-probe.yaml")"; return; }
  if ! "${kc[@]}" create --dry-run=server -o json -f "$work/dra-probe.yaml" >"$work/dra-probe.json" 2>"$work/dra-probe.err"; then
    echo "PROBLEM $why: the API server refused a dry-run ResourceSlice and DeviceClass: $(grep -v '^\s*$' "$work/dra-probe.err" | tail -n 1); fix: check the DRA feature gates and your rights (create resourceslices, deviceclasses)"
    return
  fi
  if ! gates=$(helper dra-gates --returned="$work/dra-probe.json" 2>&1); then
    echo "PROBLEM $why: cannot read the dry run's answer: ${gates#error: }"
    return
  fi
  if [[ -n $gates ]]; then
    echo "PROBLEM $why: the API server drops the fields of the feature gate(s) $gates (TDM shares, MIG counters, device taints, extended resources); fix: start kube-apiserver, kube-controller-manager and kube-scheduler with --feature-gates=${gates// /=true,}=true"
    return
  fi
  if [[ -n $nodes ]] && ! $dra; then
    echo "PROBLEM node(s) $nodes are labelled $device_api_label=dra, but --dra is not given: they run neither the Device Plugin nor the DRA plugin; fix: deploy with --dra"
    return
  fi
  echo "ok      $why: Kubernetes $server_version serves resource.k8s.io/v1 with the DRA gates"
}

cmd_precheck() {
  local problems=0 line client_version
  log "ok      cluster reachable"
  client_version=$(sed -n '/"clientVersion"/,/}/s/.*"gitVersion": *"\([^"]*\)".*/\1/p' "$work/version.json")
  log "$(skew_line "$client_version" "$server_version")"
  local rc_handler
  if rc_handler=$("${kc[@]}" get runtimeclass lj-runtime -o 'jsonpath={.handler}' 2>/dev/null); then
    if [[ $rc_handler == lj-runtime ]]; then
      log "ok      RuntimeClass lj-runtime (handler lj-runtime)"
    else
      log "PROBLEM RuntimeClass lj-runtime has handler '$rc_handler', want lj-runtime; fix: kubectl delete runtimeclass lj-runtime, then $0 deploy"
      problems=$((problems + 1))
    fi
  else
    log "ok      RuntimeClass lj-runtime absent: deploy creates it; the node's container runtime must define the lj-runtime handler (hack/node-precheck.sh)"
  fi
  if [[ $gang == required ]]; then
    if "${kc[@]}" get crd jobsets.jobset.x-k8s.io -o name >/dev/null 2>&1; then
      local jobset_image
      jobset_image=$("${kc[@]}" get deployments -A -l control-plane=controller-manager,app.kubernetes.io/name=jobset \
        -o 'jsonpath={.items[0].spec.template.spec.containers[0].image}' 2>/dev/null || true)
      log "ok      JobSet CRD jobsets.jobset.x-k8s.io present (gang scheduling needs >= $min_jobset; controller image: ${jobset_image:-not found})"
    else
      log "PROBLEM gang scheduling is enabled in the scheduler configuration and needs JobSet >= $min_jobset, but the CRD jobsets.jobset.x-k8s.io is missing; fix: kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/$min_jobset/manifests.yaml"
      problems=$((problems + 1))
    fi
  else
    log "ok      gang scheduling needs no JobSet"
  fi
  local labelled
  labelled=$("${kc[@]}" get nodes -l "$enable_label=true" -o name 2>/dev/null | wc -l) || labelled=0
  if [[ $labelled -gt 0 ]]; then
    log "ok      $labelled node(s) labelled $enable_label=true"
  else
    log "PROBLEM no node is labelled $enable_label=true; fix: kubectl label node <gpu-node> $enable_label=true"
    problems=$((problems + 1))
  fi
  if $admission && $policies_served; then
    log "ok      admission policies: Kubernetes $server_version serves ValidatingAdmissionPolicy v1 and puts the node name in pod-bound ServiceAccount tokens"
  elif $admission; then
    log "PROBLEM Kubernetes $server_version is older than 1.30: no ValidatingAdmissionPolicy v1 and no node name in ServiceAccount tokens, so the Controller's Jobs and the node agents' writes cannot be bounded by the API server; fix: upgrade the cluster to >= 1.30, or accept RBAC alone with --no-admission-policies (deploy/README.md, Rights)"
    problems=$((problems + 1))
  else
    log "warning: --no-admission-policies: the Controller may create any Job in $jobs_namespace and the node agents may patch any node and pod (RBAC alone; deploy/README.md, Rights)"
  fi
  if namespace_exists; then
    log "ok      namespace $namespace exists"
  else
    log "ok      namespace $namespace absent: deploy creates it"
  fi
  # Pod Security: the Device Plugin and Exporter pods (their namespace) and the Controller's
  # Job Agent pods (the Jobs' namespace, which deploy labels privileged) mount host paths.
  local agents=()
  [[ " ${names[*]} " == *" device-plugin "* ]] && agents+=("the Device Plugin")
  [[ " ${names[*]} " == *" exporter "* ]] && agents+=("the Exporter")
  if [[ ${#agents[@]} -gt 0 ]] && namespace_exists; then
    line=$(pod_security_line "$namespace" "$(printf '%s and ' "${agents[@]}" | sed 's/ and $//') pods")
    log "$line"
    [[ $line != PROBLEM* ]] || problems=$((problems + 1))
  fi
  if [[ " ${names[*]} " == *" controller "* ]]; then
    line=$(pod_security_line "$jobs_namespace" "the Controller's Job Agent pods (--jobs-namespace)")
    if [[ -n $line ]]; then
      log "$line"
      [[ $line != PROBLEM* ]] || problems=$((problems + 1))
    fi
  fi
  if [[ " ${extender_args[*]} " == *" --extender "* ]]; then
    local arg secret
    for arg in "${extender_args[@]}"; do
      [[ $arg == *-secret=* ]] || continue
      secret=${arg#*=}
      if "${kcn[@]}" get secret "$secret" -o name >/dev/null 2>&1; then
        log "ok      extender: Secret $namespace/$secret (${arg%%=*})"
      else
        log "PROBLEM extender: Secret $namespace/$secret (${arg%%=*}) is missing; fix: create it (deploy/README.md, Scheduler extender)"
        problems=$((problems + 1))
      fi
    done
  fi
  line=$(dra_line)
  if [[ -n $line ]]; then
    log "$line"
    [[ $line != PROBLEM* ]] || problems=$((problems + 1))
  fi
  if [[ $problems -gt 0 ]]; then die "precheck: $problems problem(s), see the PROBLEM lines above"; fi
  log "precheck passed"
}

cmd_deploy() {
  if $dra && ! $dra_served; then
    die "--dra: Kubernetes $server_version is older than 1.34: it has no resource.k8s.io/v1 for DRA mode; fix: upgrade the cluster, or deploy without --dra (see $0 precheck --dra)"
  fi
  if $admission && ! $policies_served; then
    die "Kubernetes $server_version is older than 1.30: it has no ValidatingAdmissionPolicy v1 and no node name in ServiceAccount tokens; fix: upgrade the cluster, or deploy with --no-admission-policies (RBAC alone bounds the components then; deploy/README.md, Rights)"
  fi
  local others
  others=$(other_installs)
  if [[ -n $others ]]; then
    die "the Runtime Kit is already installed in namespace $others (its ClusterRoleBindings name it) and its cluster-wide objects have fixed names; fix: operate that install with --namespace=${others%%,*}, or delete it first"
  fi
  local leave_out=()
  if $dry_run && [[ " ${names[*]} " == *" controller "* ]] \
    && ! "${kc[@]}" get namespace "$jobs_namespace" -o name >/dev/null 2>&1; then
    leave_out=("--leave-out-namespace=$jobs_namespace")
    log "dry run: the Jobs' namespace $jobs_namespace does not exist yet, so it and the objects in it are not checked (deploy creates them)"
  fi
  render_applied ${leave_out[@]+"${leave_out[@]}"} -o "$work/manifests.yaml"
  cp "$work/manifests.yaml" "$log_file.manifests.yaml"
  log "rendered $(grep -c '^kind:' "$work/manifests.yaml") objects into $log_file.manifests.yaml"
  if ! namespace_exists; then
    if $dry_run; then
      die "namespace $namespace does not exist; a server-side dry run needs it: create it (kubectl create namespace $namespace) or drop --dry-run"
    fi
    create_namespace "$namespace"
  fi
  # The Jobs' namespace is one of the rendered objects; created first (the rest of its
  # labels come with the apply), so that kubectl diff can compare the objects in it.
  if ! $dry_run && [[ " ${names[*]} " == *" controller "* ]] \
    && ! "${kc[@]}" get namespace "$jobs_namespace" -o name >/dev/null 2>&1; then
    create_namespace "$jobs_namespace"
  fi
  # A ConfigMap edited since the last deploy (kubectl edit) is replaced only by choice.
  local edits edited=""
  fetch_live
  edits=$(helper config-edits --configmaps="$work/cm-live.json" --workloads="$work/workloads-live.json" \
    --manifests="$work/manifests.yaml" --components="$components" --namespace="$namespace" 2>&1) \
    || die "${edits#error: }"
  if [[ -n $edits ]]; then
    edited=${edits%%$'\n'*}
    case $live_config in
      ask) die "${edits#*$'\n'} edited since the last deploy, which would replace them with $protocol and the defaults; choose: --keep-live-config (keep the live data, render the workloads from it) or --overwrite-config (replace it; rollback restores an edit the pods ran)" ;;
      keep)
        render_applied ${leave_out[@]+"${leave_out[@]}"} --keep-live-config="$work/cm-live.json" \
          --keep="$edited" -o "$work/manifests.yaml"
        cp "$work/manifests.yaml" "$log_file.manifests.yaml"
        log "--keep-live-config: keeping the live data of ${edits#*$'\n'}; the workloads are rendered from it" ;;
      overwrite)
        log "--overwrite-config: replacing ${edits#*$'\n'} (rollback restores the edit its pods ran)" ;;
    esac
  fi
  $dry_run || save_config --manifests="$work/manifests.yaml"
  note_revisions
  local diff_status=0
  "${kc[@]}" diff --server-side --field-manager=lj-runtimekit-deploy --force-conflicts \
    -f "$work/manifests.yaml" >"$work/diff.txt" 2>&1 || diff_status=$?
  cat "$work/diff.txt" >>"$log_file"
  if [[ $diff_status -eq 0 ]]; then
    log "no change: every object is already as rendered"
  elif [[ $diff_status -eq 1 ]]; then
    log "changes: $(grep -c '^diff ' "$work/diff.txt" || true) object(s) differ (diff in the log)"
  else
    log "kubectl diff could not compare (status $diff_status: $(grep -v '^\s*$' "$work/diff.txt" | tail -n 1)); applying anyway"
  fi
  run "${kc[@]}" apply --server-side --field-manager=lj-runtimekit-deploy --force-conflicts \
    ${dry_flags[@]+"${dry_flags[@]}"} -f "$work/manifests.yaml" \
    || die "apply failed (see the kubectl message above); fix that object or option and run deploy again (it is idempotent)"
  if $dry_run; then
    log "dry run: the API server accepted every object; nothing changed"
    return
  fi
  if [[ $gang == required ]] && ! "${kc[@]}" get crd jobsets.jobset.x-k8s.io -o name >/dev/null 2>&1; then
    log "warning: the scheduler's Coscheduling plugin requires JobSet >= $min_jobset but the CRD jobsets.jobset.x-k8s.io is missing: gangs from JobSets will not schedule; see $0 precheck"
  fi
  local labelled
  labelled=$("${kc[@]}" get nodes -l "$enable_label=true" -o name 2>/dev/null | wc -l) || labelled=0
  if [[ $labelled -eq 0 ]]; then
    log "warning: no node is labelled $enable_label=true, so the DaemonSets run nowhere; label GPU nodes: kubectl label node <gpu-node> $enable_label=true"
  fi
  local rolled=0
  wait_rollouts "${names[@]}" || rolled=1
  record_rollback_points
  if [[ -n $dra_resource ]]; then
    run "${kcn[@]}" rollout status "$dra_resource" --timeout="$timeout" || rollout_failed+=(dra-plugin)
    [[ " ${rollout_failed[*]} " != *" dra-plugin "* ]] || rolled=1
  elif [[ -n $(dra_nodes) ]]; then
    log "warning: node(s) $(dra_nodes) are labelled $device_api_label=dra but --dra is not given: they run neither the Device Plugin nor the DRA plugin; fix: deploy with --dra"
  fi
  if [[ $rolled -ne 0 ]]; then
    die "not rolled out within $timeout: ${rollout_failed[*]}; fix: see '$0 status --components=$(IFS=,; echo "${rollout_failed[*]}") --namespace=$namespace' and kubectl -n $namespace describe pods -l app=lj-runtimekit-<component>"
  fi
  cmd_status
  log "deploy done"
}

cmd_status() {
  local dra_status=()
  $dra && dra_status=(--dra)
  snapshot
  helper status --snapshot="$work" --components="$components" --namespace="$namespace" \
    --protocol="$protocol" ${dra_status[@]+"${dra_status[@]}"} | tee -a "$log_file"
}

# fetch_pod_metrics: every running scheduler and exporter pod's /metrics into
# $work/metrics/<pod>.txt (<pod>.err: why not): from --metrics-url=POD=URL, else, with no
# --metrics-url at all, through the API server proxy (8 at a time).
fetch_pod_metrics() {
  local app port pod pair url running=0
  mkdir -p "$work/metrics"
  for pair in ${pod_metrics[@]+"${pod_metrics[@]}"}; do
    pod=${pair%%=*}
    url=${pair#*=}
    helper fetch-metrics --url="$url" -o "$work/metrics/$pod.txt" 2>"$work/metrics/$pod.err" \
      || rm -f "$work/metrics/$pod.txt"
  done
  [[ -z $metrics_url && ${#pod_metrics[@]} -eq 0 ]] || return 0
  for app in scheduler-framework:$scheduler_port exporter:$exporter_port; do
    [[ " ${names[*]} " == *" ${app%%:*} "* ]] || continue
    port=${app#*:}
    for pod in $("${kcn[@]}" get pods -l "app=lj-runtimekit-${app%%:*}" --field-selector=status.phase=Running \
      -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null || true); do
      ( "${kcn[@]}" get --raw "/api/v1/namespaces/$namespace/pods/$pod:$port/proxy/metrics" \
          --request-timeout=10s >"$work/metrics/$pod.txt" 2>"$work/metrics/$pod.err" \
          || rm -f "$work/metrics/$pod.txt" ) &
      running=$((running + 1))
      if (( running % 8 == 0 )); then wait; fi
    done
  done
  wait
}

cmd_verify() {
  snapshot
  fetch_pod_metrics
  local problems=0 out
  local dra_verify=()
  $dra && dra_verify=(--dra)
  if ! helper verify --snapshot="$work" --components="$components" --namespace="$namespace" \
    --protocol="$protocol" --protocol-name=deploy/protocol.yaml --metrics-dir="$work/metrics" \
    ${dra_verify[@]+"${dra_verify[@]}"} \
    >"$work/verify.txt" 2>&1; then
    problems=$((problems + $(grep -c '^PROBLEM' "$work/verify.txt" || true)))
    grep -q '^PROBLEM' "$work/verify.txt" || problems=$((problems + 1))
  fi
  tee -a "$log_file" <"$work/verify.txt"
  if "${kc[@]}" get runtimeclass lj-runtime -o name >/dev/null 2>&1; then
    log "ok      RuntimeClass lj-runtime"
  else
    log "PROBLEM RuntimeClass lj-runtime is missing; fix: $0 deploy"
    problems=$((problems + 1))
  fi
  if [[ " ${names[*]} " == *" exporter "* ]]; then
    if [[ -n $metrics_url ]]; then
      out=$(helper check-metrics --url="$metrics_url" 2>&1) || problems=$((problems + 1))
      log "$out"
    else
      local pod checked=0
      for pod in $("${kcn[@]}" get pods -l app=lj-runtimekit-exporter --field-selector=status.phase=Running \
        -o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null || true); do
        [[ $checked -lt 3 ]] || break
        if [[ ${#pod_metrics[@]} -gt 0 && ! -f $work/metrics/$pod.txt ]]; then continue; fi
        checked=$((checked + 1))
        if [[ -f $work/metrics/$pod.txt ]]; then
          out=$(helper check-metrics "$work/metrics/$pod.txt" --where="pod $namespace/$pod") || problems=$((problems + 1))
          log "$out"
        else
          log "PROBLEM exporter pod $namespace/$pod: metrics not reachable through the API server proxy ($(tail -n 1 "$work/metrics/$pod.err" 2>/dev/null)); fix: check the pod, or use --metrics-url with kubectl port-forward"
          problems=$((problems + 1))
        fi
      done
      if [[ $checked -eq 0 ]]; then
        log "PROBLEM no Running exporter pod to read metrics from; fix: $0 status --components=exporter"
        problems=$((problems + 1))
      fi
    fi
  fi
  if [[ $problems -gt 0 ]]; then die "verify: $problems problem(s), see the PROBLEM lines above"; fi
  log "verify passed"
}

state_key='lj-runtimekit.io/feature-state'

# disable_nodes: removes the enable label from every node; the Controller runs the disable
# Job on each node it enabled; waits (--timeout) for their state to say disabled.
disable_nodes() {
  local labelled managed node state pending=() ready
  labelled=$("${kc[@]}" get nodes -l "$enable_label" -o name) || die "cannot list the nodes"
  managed=$("${kc[@]}" get nodes -l "$state_key,$state_key!=disabled" -o name) || die "cannot list the nodes"
  if [[ -z $labelled$managed ]]; then log "no node is enabled: nothing to disable"; return; fi
  ready=$("${kcn[@]}" get deployment lj-runtimekit-controller -o 'jsonpath={.status.readyReplicas}' 2>/dev/null || true)
  if [[ -n $managed && ${ready:-0} -eq 0 ]]; then
    die "the Controller (deployment $namespace/lj-runtimekit-controller) has no ready replica, so nothing can disable the Runtime features of $(echo "$managed" | sed 's|node/||' | paste -sd, -); fix: bring the Controller back, or delete with --keep-node-state (the nodes keep their features and labels)"
  fi
  $dry_run && { log "dry run: would remove $enable_label from $(echo "$labelled" | wc -l) node(s)"; return; }
  for node in $labelled; do
    run "${kc[@]}" label "$node" "$enable_label-" >/dev/null || die "cannot remove the label $enable_label from $node"
  done
  for node in $managed; do pending+=("$node"); done
  [[ ${#pending[@]} -gt 0 ]] || return 0
  log "waiting up to $timeout for the Controller to disable ${#pending[@]} node(s)"
  if ! "${kc[@]}" wait "${pending[@]}" --for="jsonpath={.metadata.labels.lj-runtimekit\.io/feature-state}=disabled" \
    --timeout="$timeout" >>"$log_file" 2>&1; then
    local why=()
    for node in "${pending[@]}"; do
      state=$("${kc[@]}" get "$node" -o "jsonpath={.metadata.annotations.lj-runtimekit\.io/feature-state}: {.metadata.annotations.lj-runtimekit\.io/feature-message}" 2>/dev/null || true)
      [[ $state == disabled:* ]] || why+=("${node#node/} ${state%: }")
    done
    die "not disabled within $timeout: $(IFS=';'; echo "${why[*]}"); the enable label is removed, the Controller keeps trying; fix: see kubectl get nodes -L $state_key and the Controller's Jobs in $jobs_namespace, then delete again, or --keep-node-state"
  fi
  log "disabled ${#pending[@]} node(s)"
}

# clean_nodes: removes the Runtime Kit's labels and annotations from every node.
clean_nodes() {
  local node patch count=0
  "${kc[@]}" get nodes -o json >"$work/nodes.json" || die "cannot list the nodes"
  while read -r node patch; do
    [[ -n $node ]] || continue
    "${kc[@]}" patch node "$node" --type=merge -p "$patch" ${dry_flags[@]+"${dry_flags[@]}"} >>"$log_file" 2>&1 \
      || die "cannot remove the Runtime Kit's labels and annotations from node $node (needs nodes patch rights)"
    count=$((count + 1))
  done < <(helper node-keys --nodes="$work/nodes.json" --protocol="$protocol")
  log "$($dry_run && echo 'dry run: would remove' || echo removed) the Runtime Kit's labels and annotations from $count node(s)"
}

cmd_delete() {
  local extra=() others
  $all_selected || extra=(--no-common)
  # Read whole, not piped into `grep -q`: under pipefail kubectl's SIGPIPE, once grep has
  # quit at the first line, would make a found class read as none.
  local classes=""
  if ! $dra && $dra_served; then
    classes=$("${kc[@]}" get deviceclasses -l app=lj-runtimekit-dra-plugin -o name 2>/dev/null) || classes=""
  fi
  if [[ -n $classes ]]; then
    log "DRA mode is installed (its DeviceClasses exist): deleting it too"
    dra=true
    extra+=(--dra)
  fi
  others=$(other_installs)
  if [[ -n $others ]]; then
    extra=(--only-namespace="$namespace")
    log "the cluster-wide objects belong to the install in namespace $others: kept; removing only what is in namespace $namespace"
  fi
  local node_steps=false
  [[ -z $others && " ${names[*]} " == *" controller "* ]] && node_steps=true
  if $node_steps && $keep_node_state; then
    log "--keep-node-state: the nodes keep their Runtime features, labels and annotations"
  elif $node_steps; then
    disable_nodes
  fi
  render ${extra[@]+"${extra[@]}"} -o "$work/manifests.yaml" 2>"$work/render.err" \
    || die "$(sed 's/^error: //' "$work/render.err")"
  run "${kc[@]}" delete --ignore-not-found --wait=true --timeout="$timeout" \
    ${dry_flags[@]+"${dry_flags[@]}"} -f "$work/manifests.yaml" \
    || die "delete failed (see above); run delete again (it is idempotent)"
  if $dra && [[ -z $others ]]; then
    # The DeviceClasses of any options (the MIG profiles' classes of another list).
    run "${kc[@]}" delete deviceclasses -l app=lj-runtimekit-dra-plugin --ignore-not-found \
      ${dry_flags[@]+"${dry_flags[@]}"} || die "cannot delete the DRA mode's DeviceClasses"
    # After the DRA plugin's pods are gone (delete waits), so none publishes them again.
    run "${kc[@]}" delete resourceslices --field-selector="spec.driver=$dra_driver" \
      --ignore-not-found ${dry_flags[@]+"${dry_flags[@]}"} \
      || die "cannot delete the ResourceSlices of driver $dra_driver"
  fi
  if [[ -z $others && " ${names[*]} " == *" scheduler-framework "* ]]; then
    run "${kcn[@]}" delete lease lj-runtimekit-scheduler-framework --ignore-not-found \
      ${dry_flags[@]+"${dry_flags[@]}"} || die "cannot delete the scheduler's Lease in $namespace"
  fi
  if $node_steps; then
    run "${kc[@]}" delete lease lj-runtimekit-controller --namespace="$jobs_namespace" --ignore-not-found \
      ${dry_flags[@]+"${dry_flags[@]}"} || die "cannot delete the Controller's Lease in $jobs_namespace"
  fi
  if $node_steps && $all_selected && ! $keep_node_state; then clean_nodes; fi
  if $all_selected && namespace_exists; then
    local owner
    owner=$("${kc[@]}" get namespace "$namespace" -o 'jsonpath={.metadata.labels.app\.kubernetes\.io/part-of}' 2>/dev/null || true)
    if [[ $owner == lj-runtimekit ]]; then
      run "${kc[@]}" delete namespace "$namespace" --ignore-not-found --wait=false \
        ${dry_flags[@]+"${dry_flags[@]}"} || die "cannot delete namespace $namespace"
    fi
  fi
  log "delete done"
}

cmd_upgrade() {
  local name res before=()
  for name in "${names[@]}"; do
    res=$(resource_of "$name")
    "${kcn[@]}" get "$res" -o name >/dev/null 2>&1 \
      || die "$name is not deployed in namespace $namespace ($res); fix: $0 deploy --components=$name --namespace=$namespace"
    before+=("$(images_of "$res")")
  done
  render_applied --workloads-only -o "$work/workloads.yaml"
  $dry_run || save_config
  note_revisions
  run "${kc[@]}" apply --server-side --field-manager=lj-runtimekit-deploy --force-conflicts \
    ${dry_flags[@]+"${dry_flags[@]}"} -f "$work/workloads.yaml" \
    || die "setting the images failed (see above); nothing else was changed"
  if $dry_run; then log "dry run: the API server accepted the new images"; return; fi
  wait_rollouts "${names[@]}" || true
  record_rollback_points
  local i=0
  for name in "${names[@]}"; do
    res=$(resource_of "$name")
    if [[ " ${rollout_failed[*]} " != *" $name "* ]]; then
      log "upgraded $name: ${before[$i]% } -> $(images_of "$res" | sed 's/ $//')"
    fi
    i=$((i + 1))
  done
  if [[ ${#rollout_failed[@]} -gt 0 ]]; then
    die "upgrade to $version did not roll out within $timeout: ${rollout_failed[*]}; to return: $0 rollback --components=$(IFS=,; echo "${rollout_failed[*]}") --namespace=$namespace"
  fi
  log "upgrade to $version done"
}

cmd_rollback() {
  local name res rev current targets=() revs=() currents=() before=()
  for name in "${names[@]}"; do
    res=$(resource_of "$name")
    [[ -n $(images_of "$res") ]] || die "$name is not deployed in namespace $namespace ($res)"
    rev=$(rollback_point_of "$name")
    current=$(revision_of "$res")
    if [[ -z $rev || $rev == "$current" ]]; then
      log "$name: the last deploy or upgrade did not change it (revision $current): left as it is"
    else
      targets+=("$name"); revs+=("$rev"); currents+=("$current"); before+=("$(images_of "$res")")
    fi
  done
  # The configuration first (recorded by the last deploy or upgrade), then the pods.
  "${kcn[@]}" get configmaps -l app.kubernetes.io/part-of=lj-runtimekit -o json >"$work/cm-live.json" \
    || die "cannot list the ConfigMaps in namespace $namespace"
  helper config-restore --configmaps="$work/cm-live.json" --names="$(configmap_names)" \
    >"$work/restore.txt" 2>"$work/restore.err" || die "$(sed 's/^error: //' "$work/restore.err")"
  if [[ ${#targets[@]} -eq 0 && ! -s $work/restore.txt ]]; then
    die "nothing to roll back: no selected workload or ConfigMap was changed by the last deploy or upgrade"
  fi
  local cm current_sum previous patch
  while read -r cm current_sum previous patch; do
    [[ -n $cm ]] || continue
    "${kcn[@]}" patch configmap "$cm" --type=merge --field-manager=lj-runtimekit-deploy \
      ${dry_flags[@]+"${dry_flags[@]}"} -p "$patch" >>"$log_file" 2>&1 \
      || die "cannot restore ConfigMap $namespace/$cm (see the kubectl message in $log_file)"
    log "rolled back ConfigMap $cm: data checksum $current_sum -> $previous"
  done <"$work/restore.txt"
  [[ ${#targets[@]} -gt 0 ]] || { log "rollback done"; return; }
  local i=0
  for name in "${targets[@]}"; do
    res=$(resource_of "$name")
    if ! run "${kcn[@]}" rollout undo "$res" --to-revision="${revs[$i]}" ${dry_flags[@]+"${dry_flags[@]}"}; then
      die "cannot roll back $name ($res) to revision ${revs[$i]}: see the kubectl message above (kubectl rollout history $res lists the revisions)"
    fi
    $dry_run || set_rollback_point "$name" "${currents[$i]}" # a second rollback undoes this one
    i=$((i + 1))
  done
  if $dry_run; then log "dry run: the API server accepted the rollbacks"; return; fi
  wait_rollouts "${targets[@]}" || true
  i=0
  for name in "${targets[@]}"; do
    res=$(resource_of "$name")
    if [[ " ${rollout_failed[*]} " != *" $name "* ]]; then
      log "rolled back $name: ${before[$i]% } -> $(images_of "$res" | sed 's/ $//')"
    fi
    i=$((i + 1))
  done
  if [[ ${#rollout_failed[@]} -gt 0 ]]; then
    die "rollback did not finish within $timeout: ${rollout_failed[*]}; fix: see $0 status"
  fi
  log "rollback done"
}

cmd_cleanup() {
  "${kc[@]}" get nodes -o json >"$work/nodes.json" || die "cannot list the nodes"
  local lines node patch count=0
  lines=$(helper stale-patches --nodes="$work/nodes.json" --protocol="$protocol")
  if [[ -z $lines ]]; then
    log "no stale protocol resources on any node"
    return
  fi
  while read -r node patch; do
    run "${kc[@]}" patch node "$node" --subresource=status --type=json -p "$patch" \
      ${dry_flags[@]+"${dry_flags[@]}"} || die "cannot patch the status of node $node (needs nodes/status patch rights)"
    count=$((count + 1))
  done <<<"$lines"
  log "removed stale resources from $count node(s)"
}

case $op in
  precheck) cmd_precheck ;;
  deploy) cmd_deploy ;;
  status) cmd_status ;;
  verify) cmd_verify ;;
  upgrade) cmd_upgrade ;;
  rollback) cmd_rollback ;;
  delete) cmd_delete ;;
  cleanup-stale-resources) cmd_cleanup ;;
esac
