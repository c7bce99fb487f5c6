#!/usr/bin/env bash
# Builds the image(s) of one component from the repository root, tagged
# <registry>/lj-runtimekit-<image>:<VERSION>, with VERSION and the git revision
# as OCI labels, and records each image's reference, ID and digest in
# dist/images.json. Called by `make -C <Component> docker`.
#
# Two builders: Docker (BuildKit) when a Docker engine answers, buildah otherwise
# (no daemon, run as root: chroot isolation, the storage under /var/lib/containers;
# STORAGE_DRIVER=vfs where overlay mounts are refused). With buildah the registry
# bases are not pulled: hack/base-image.sh provides a Debian bookworm Python 3.11
# base built from Debian's packages and the uv of this machine (its UV_VERSION),
# and the machine's CA bundle (SSL_CERT_FILE, else Debian's) is mounted over the
# build stage's for the wheel downloads (nothing of it lands in an image). Files
# and the image creation time carry the last commit's time, without build history:
# the same sources and base give the same image ID (the config digest); the
# manifest digest of the local storage may still differ (buildah notes the stage
# it built on), a pushed one is the registry's. Afterwards the buildah images that
# no tagged image builds on are removed (one buildah build at a time).
#
# Usage: deploy/docker/build.sh COMPONENT [--push]
#   COMPONENT: device-plugin, scheduler-framework, exporter, controller
#              (controller builds the controller and the controller-job-agent images)
# Environment: IMAGE_REGISTRY (default the project registry), BUILDER (docker or
#   buildah; default docker when an engine answers, else buildah), DOCKER (default
#   docker), BUILDAH (default buildah), PYTHON_IMAGE (the base; default the
#   Dockerfile's with docker, hack/base-image.sh's with buildah), IMAGES_JSON
#   (default dist/images.json).
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
epoch=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
images_json=${IMAGES_JSON:-$root/dist/images.json}

docker=${DOCKER:-docker}
buildah=${BUILDAH:-buildah}
engine_answers() { command -v "$docker" >/dev/null 2>&1 && "$docker" info >/dev/null 2>&1; }
builder=${BUILDER:-}
if [[ -z $builder ]]; then
  if engine_answers; then
    builder=docker
  elif command -v "$buildah" >/dev/null 2>&1; then
    builder=buildah
  else
    die "no Docker engine answers ('$docker info') and '$buildah' is not installed: make deps installs buildah, or start the engine"
  fi
fi
case $builder in
  docker)
    command -v "$docker" >/dev/null 2>&1 || die "BUILDER=docker: '$docker' not found: install Docker (with BuildKit) or set DOCKER"
    engine_answers || die "BUILDER=docker: no Docker engine answers ('$docker info' failed): start the engine or set DOCKER_HOST"
    ;;
  buildah)
    command -v "$buildah" >/dev/null 2>&1 || die "BUILDER=buildah: '$buildah' not found: make deps installs it (Debian package buildah)"
    ;;
  *) die "BUILDER is '$builder'; expected docker or buildah" ;;
esac

base_args=()
[[ -n ${PYTHON_IMAGE:-} ]] && base_args=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
if [[ $builder == buildah ]]; then
  bases=$(BUILDAH=$buildah bash "$root/hack/base-image.sh")
  uv_image=$(sed -n 's/^uv=//p' <<<"$bases")
  # The uv stage is the local image; an unset PYTHON_IMAGE means the local base.
  base_args+=(--build-context "uv=docker-image://$uv_image")
  [[ -n ${PYTHON_IMAGE:-} ]] || base_args+=(--build-arg "PYTHON_IMAGE=$(sed -n 's/^python=//p' <<<"$bases")")
  ca_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
  if [[ -f $ca_bundle ]]; then
    base_args+=(--volume "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro")
  fi
fi

# record IMAGE REF ID DIGEST: merges one image's entry into $images_json.
record() {
  mkdir -p "$(dirname "$images_json")"
  python3 - "$images_json" "$@" "$builder" "$version" "$revision" <<'EOF'
import json, pathlib, sys
path, image, ref, image_id, digest, builder, version, revision = sys.argv[1:]
file = pathlib.Path(path)
found = json.loads(file.read_text()) if file.exists() else {}
found[image] = {"ref": ref, "id": image_id, "digest": digest, "builder": builder,
                "version": version, "revision": revision}
file.write_text(json.dumps(dict(sorted(found.items())), indent=2) + "\n")
EOF
}

# prune: removes the buildah images that no tagged image builds on (the ones replaced
# by this build and their stages); the layer cache of the tagged ones stays.
prune() {
  python3 - "$buildah" <<'EOF'
import json, subprocess, sys
def buildah(*argv: str) -> str:
    return subprocess.run([sys.argv[1], *argv], capture_output=True, text=True, check=True).stdout
listed = json.loads(buildah("images", "--all", "--json"))
layers = {i["id"]: tuple(json.loads(buildah("inspect", "--type", "image", i["id"]))
                         ["OCIv1"]["rootfs"]["diff_ids"] or ()) for i in listed}
kept = [layers[i["id"]] for i in listed if i["names"]]
unused = [i for i, own in layers.items() if not any(k[:len(own)] == own for k in kept)]
if unused:
    subprocess.run([sys.argv[1], "rmi", *unused], capture_output=True, check=False)
EOF
}

for image in "${images[@]}"; do
  ref="$registry/lj-runtimekit-$image:$version"
  echo "building $ref (revision $revision, $builder)"
  common=(
    --file "$root/deploy/docker/$image.Dockerfile"
    --build-arg "VERSION=$version"
    --build-arg "GIT_REVISION=$revision"
    --build-arg "SOURCE_DATE_EPOCH=$epoch"
    "${base_args[@]}"
  )
  if [[ $builder == docker ]]; then
    DOCKER_BUILDKIT=1 "$docker" build "${common[@]}" --tag "$ref" "$root"
    image_id=$("$docker" image inspect --format '{{.Id}}' "$ref")
    digest=""
    if $push; then
      "$docker" push "$ref"
      digest=$("$docker" image inspect --format '{{index .RepoDigests 0}}' "$ref")
      digest=${digest#*@}
    fi
  else
    # The build stage with the layer cache (which needs the build history), then the
    # runtime stage on it without history or builder label: a reproducible image.
    stage="localhost/lj-runtimekit-build-stage/$image:latest"
    ignore="$root/deploy/docker/$image.Dockerfile.dockerignore"
    "$buildah" build --isolation chroot --layers --pull=false --target build \
      --ignorefile "$ignore" "${common[@]}" --tag "$stage" "$root"
    "$buildah" build --isolation chroot --pull=false --timestamp "$epoch" \
      --omit-history --identity-label=false --build-context "build=docker-image://$stage" \
      --ignorefile "$ignore" "${common[@]}" --tag "$ref" "$root"
    image_id=sha256:$("$buildah" inspect --type image --format '{{.FromImageID}}' "$ref")
    # The manifest digest in the local storage; a push (compressed layers) has its own.
    digest=$("$buildah" inspect --type image --format '{{.FromImageDigest}}' "$ref")
    if $push; then
      digest_file=$(mktemp)
      "$buildah" push --digestfile "$digest_file" "$ref" "docker://$ref"
      digest=$(<"$digest_file")
      rm -f "$digest_file"
    fi
  fi
  record "$image" "$ref" "$image_id" "$digest"
  echo "built $ref $digest"
done
if [[ $builder == buildah ]]; then prune; fi
