#!/usr/bin/env bash
# Builds the image(s) of one component from the repository root, tagged
# <registry>/lj-runtimekit-<image>:<VERSION>, with VERSION and the git revision
# as OCI labels. Called by `make -C <Component> docker`.
#
# Usage: deploy/docker/build.sh COMPONENT [--push]
#   COMPONENT: device-plugin, scheduler-framework, exporter, controller
#              (controller builds the controller and the controller-job-agent images)
# Environment: IMAGE_REGISTRY (default the project registry), DOCKER (default docker).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "docker/build.sh: error: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: deploy/docker/build.sh COMPONENT [--push]"
component=$1
push=false
[[ ${2-} == --push ]] && push=true
case $component in
  device-plugin|scheduler-framework|exporter) images=("$component") ;;
  controller) images=(controller controller-job-agent) ;;
  *) die "unknown component '$component'; known: device-plugin, scheduler-framework, exporter, controller" ;;
esac

registry=${IMAGE_REGISTRY:-lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit}
version=$(tr -d '[:space:]' <"$root/VERSION")
[[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] \
  || die "$root/VERSION holds '$version'; expected v{major}.{feature}.{iteration}"
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && [[ -n $(git -C "$root" status --porcelain 2>/dev/null) ]]; then
  revision="$revision-dirty"
fi

docker=${DOCKER:-docker}
command -v "$docker" >/dev/null 2>&1 || die "'$docker' not found: install Docker (with BuildKit) or set DOCKER"
"$docker" info >/dev/null 2>&1 \
  || die "no Docker engine answers ('$docker info' failed): start the engine or set DOCKER_HOST"

for image in "${images[@]}"; do
  ref="$registry/lj-runtimekit-$image:$version"
  echo "building $ref (revision $revision)"
  DOCKER_BUILDKIT=1 "$docker" build \
    --file "$root/deploy/docker/$image.Dockerfile" \
    --build-arg "VERSION=$version" \
    --build-arg "GIT_REVISION=$revision" \
    --tag "$ref" \
    "$root"
  if $push; then "$docker" push "$ref"; fi
done
