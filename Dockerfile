# syntax=docker/dockerfile:1
# Image of the rdma-hca device plugin. Build from the repository root (docs/install.md,
# "The image", shows the multi-arch build and push):
#   docker build -t ghcr.io/rdma-hca/rdma-hca:0.1.0 --build-arg VERSION=0.1.0 .
# The chart runs it as uid 0 with every capability dropped and a read-only root filesystem:
# uid 0 only so it may create its socket in the kubelet's root-owned device-plugins dir.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Only what the wheel is built from, so unrelated changes keep the cache.
COPY pyproject.toml README.md ./
COPY src ./src
# A node runs no devkit (simulated nodes, kubelet emulator, demo, benchmarks): the wheel is
# built without it, and `rdma-hca demo` in the image says so in one line.
RUN rm -rf src/rdma_hca/devkit \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="rdma-hca" \
      org.opencontainers.image.description="Kubernetes device plugin that offers a node's RDMA HCAs as the shared extended resource rdma/hca" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm"
# No .pyc files on a read-only root; logs reach `kubectl logs` at once.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:${PATH}
# The wheel comes in through a bind mount, so it does not stay in a layer; its dependencies
# come from the package index with the ranges pyproject.toml declares.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir /wheels/*.whl \
    && rdma-hca --help > /dev/null \
    && python -c "import importlib.util as u, sys; sys.exit(u.find_spec('rdma_hca.devkit') is not None)"
ENTRYPOINT ["rdma-hca"]
CMD ["serve"]
