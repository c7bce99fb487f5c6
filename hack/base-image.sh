#!/usr/bin/env bash
# Provides the two base images of deploy/docker/*.Dockerfile in the local buildah
# storage, built offline from packages where the registry bases cannot be pulled:
#   python  the Debian bookworm Python 3.11 runtime (mmdebstrap from Debian's packages:
#           the Essential set, python3, ca-certificates, libstdc++6 (grpcio); no docs, man pages or locales),
#           the stand-in for python:3.11.x-slim-bookworm;
#   uv      /uv and /uvx of the uv running this script or on PATH (hack/bootstrap.sh
#           installs it from PyPI at UV_VERSION; another version is replaced by the
#           pinned one, installed into the cache below), the stand-in for
#           ghcr.io/astral-sh/uv:UV_VERSION.
# The bookworm root file system is cached as a tar under
# ${XDG_CACHE_HOME:-~/.cache}/lj-runtimekit/base/, keyed by this script: a cold
# build takes about a minute, an import from the cache a few seconds, an image already
# in the storage nothing. LJ_BASE_REFRESH=1 builds the root file system anew (newer
# Debian security updates).
#
# Usage: hack/base-image.sh   prints "python=REF" and "uv=REF" on stdout.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "base-image.sh: error: $*" >&2; exit 1; }
log() { echo "base-image.sh: $*" >&2; }

buildah=${BUILDAH:-buildah}
command -v "$buildah" >/dev/null 2>&1 || die "'$buildah' not found: make deps installs it (Debian package buildah)"
uv_version=$(sed -n 's/^UV_VERSION=//p' "$root/hack/bootstrap.sh")
[[ -n $uv_version ]] || die "no UV_VERSION= line in $root/hack/bootstrap.sh"

suite=bookworm
packages=python3,ca-certificates,libstdc++6
mirrors=(
  "deb http://deb.debian.org/debian $suite main"
  "deb http://deb.debian.org/debian $suite-updates main"
  "deb http://deb.debian.org/debian-security $suite-security main"
)
# Fixed file and image times: the same root file system gives the same image digest.
epoch=1700000000
# The cache key: this recipe (a changed script builds anew).
key=$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-12)
python_ref=localhost/lj-runtimekit-python:3.11-$suite-$key
uv_ref=localhost/lj-runtimekit-uv:$uv_version-$key
cache=${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit/base
rootfs=$cache/python-$suite-$key.tar

exists() { "$buildah" inspect --type image "$1" >/dev/null 2>&1; }

if [[ ${LJ_BASE_REFRESH:-} == 1 ]]; then
  rm -f "$rootfs"
  if exists "$python_ref"; then "$buildah" rmi "$python_ref" >/dev/null; fi
fi

if ! exists "$python_ref"; then
  if [[ ! -s $rootfs ]]; then
    command -v mmdebstrap >/dev/null 2>&1 \
      || die "'mmdebstrap' not found: make deps installs it (Debian package mmdebstrap)"
    mkdir -p "$cache"
    rm -f "$cache/python-$suite-"*  # the root file systems of older recipes
    log "building the $suite root file system with mmdebstrap into $rootfs"
    SOURCE_DATE_EPOCH=$epoch mmdebstrap --quiet --format=tar --variant=essential --include="$packages" \
      --aptopt='APT::Install-Recommends "false"' \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$suite" "$rootfs.partial" "${mirrors[@]}" >"$rootfs.log" 2>&1 \
      || die "mmdebstrap failed; its output is in $rootfs.log"
    mv "$rootfs.partial" "$rootfs"
  fi
  python_deb=$(tar -xOf "$rootfs" ./var/lib/dpkg/status \
    | awk '/^Package: /{p=$2} /^Version: /{if (p=="python3.11") print $2}')
  log "importing $rootfs as $python_ref (Debian python3.11 $python_deb)"
  ctr=$("$buildah" from scratch)
  trap '"$buildah" rm "$ctr" >/dev/null 2>&1 || true' EXIT
  "$buildah" add --quiet "$ctr" "$rootfs" / >/dev/null
  "$buildah" config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd python3 \
    --label org.opencontainers.image.title=lj-runtimekit-python \
    --label "org.opencontainers.image.description=Debian $suite with python3.11 $python_deb" \
    --label "org.opencontainers.image.version=$python_deb" \
    "$ctr"
  "$buildah" commit --quiet --rm --timestamp "$epoch" --identity-label=false "$ctr" "$python_ref" >/dev/null
  trap - EXIT
fi

if ! exists "$uv_ref"; then
  # The uv that runs this script (uv run sets UV), else the one on PATH; never
  # `python3 -c 'import uv'`: under `uv run` python3 is the project's environment,
  # which has no uv package.
  uv_bin=${UV:-$(command -v uv || true)}
  [[ -n $uv_bin && -x $uv_bin ]] || die "uv not found on PATH: make deps installs it (uv $uv_version from PyPI)"
  found=$("$uv_bin" --version | awk '{print $2}')
  if [[ $found != "$uv_version" ]]; then
    # Another uv serves the developer; the images carry the pinned one, installed
    # once into the cache beside the root file system.
    pinned=$cache/uv-$uv_version
    if [[ ! -x $pinned/bin/uv ]]; then
      log "$uv_bin is uv $found; installing uv $uv_version from PyPI into $pinned"
      rm -rf "$pinned"
      "$uv_bin" pip install --quiet --target "$pinned" "uv==$uv_version" >&2 \
        || die "could not install uv $uv_version into $pinned (hack/bootstrap.sh UV_VERSION)"
    fi
    uv_bin=$pinned/bin/uv
    found=$("$uv_bin" --version | awk '{print $2}')
    [[ $found == "$uv_version" ]] \
      || die "$uv_bin is uv $found; the images need uv $uv_version (hack/bootstrap.sh UV_VERSION)"
  fi
  log "importing $uv_bin (uv $uv_version) as $uv_ref"
  ctr=$("$buildah" from scratch)
  trap '"$buildah" rm "$ctr" >/dev/null 2>&1 || true' EXIT
  "$buildah" copy --quiet --chmod 0755 "$ctr" "$uv_bin" /uv >/dev/null
  "$buildah" copy --quiet --chmod 0755 "$ctr" "$(dirname "$uv_bin")/uvx" /uvx >/dev/null
  "$buildah" config --entrypoint '["/uv"]' "$ctr"
  "$buildah" commit --quiet --rm --timestamp "$epoch" --identity-label=false "$ctr" "$uv_ref" >/dev/null
  trap - EXIT
fi

echo "python=$python_ref"
echo "uv=$uv_ref"
