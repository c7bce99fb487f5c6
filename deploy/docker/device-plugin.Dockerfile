# syntax=docker/dockerfile:1.7
# Image lj-runtimekit-device-plugin: Device Plugin: advertises the node's accelerators to the kubelet.
# Built by `make -C DevicePlugin docker` (deploy/docker/build.sh) from the repository root:
#   docker build -f deploy/docker/device-plugin.Dockerfile --build-arg VERSION=$(cat VERSION) \
#     --build-arg GIT_REVISION=$(git rev-parse HEAD) .
# Stage 1 builds the wheels with uv and installs them with the dependency versions
# and hashes of uv.lock into a virtual environment (the context is the workspace
# without tests, build trees and caches: uv reads every member's pyproject.toml);
# stage 2 is the slim runtime with only that environment. PYTHON_IMAGE is the base
# of both: the registry's python slim image by default; build.sh passes the local
# Debian one of hack/base-image.sh when it builds with buildah.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG UV_VERSION=0.13.9

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
# uv trusts the base's CA bundle (build.sh may mount the machine's over it). For the
# same layer from the same sources: bytecode hash-checked (SOURCE_DATE_EPOCH set), and
# no uv_cache.json (the build time uv notes for the wheels installed from a path).
ARG SOURCE_DATE_EPOCH
ENV UV_NO_CACHE=1 UV_PYTHON_DOWNLOADS=never UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1 \
    PYTHONDONTWRITEBYTECODE=1 SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
WORKDIR /src
COPY . .
RUN uv build --wheel --out-dir /wheels proto \
 && uv build --wheel --out-dir /wheels DevicePlugin \
 && uv export --frozen --no-dev --no-emit-workspace \
      --package lj-runtimekit-deviceplugin --output-file /wheels/requirements.txt \
 && uv venv /opt/lj-runtimekit \
 && uv pip install --python /opt/lj-runtimekit/bin/python --require-hashes \
      -r /wheels/requirements.txt \
 && uv pip install --python /opt/lj-runtimekit/bin/python --no-deps /wheels/*.whl \
 && for d in /opt/lj-runtimekit/lib/python3*/site-packages/lj_runtimekit_*.dist-info; do \
      rm -f "$d/uv_cache.json" && sed -i '/\/uv_cache\.json,/d' "$d/RECORD" || exit 1; done \
 && uv pip check --python /opt/lj-runtimekit/bin/python \
 && /opt/lj-runtimekit/bin/lj-device-plugin --help >/dev/null

FROM ${PYTHON_IMAGE}
ARG VERSION
ARG GIT_REVISION=unknown
LABEL org.opencontainers.image.title="lj-runtimekit-device-plugin" \
      org.opencontainers.image.description="LJ Runtime Kit Device Plugin: advertises the node's accelerators to the kubelet" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_REVISION}" \
      org.opencontainers.image.vendor="LJ Runtime Kit"
COPY --from=build /opt/lj-runtimekit /opt/lj-runtimekit
ENV PATH=/opt/lj-runtimekit/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default; the node agents' DaemonSets run as uid 0 (without any
# capability) only because the Runtime sockets and the kubelet plugin directory on
# the host belong to root.
USER 65532:65532
ENTRYPOINT ["lj-device-plugin"]
