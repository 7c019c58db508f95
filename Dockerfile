# syntax=docker/dockerfile:1
#
# The capl controller manager image.
#
#   docker build -t capl-manager:dev .                   (or: podman build, buildah bud)
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/capl-dev/capl:v0.1.0 .
#
# Two stages: `builder` compiles wheels for capl and its pinned dependencies (libvirt-python
# needs a C compiler and libvirt's headers); the final stage installs only those wheels on the
# same slim base, with libvirt's client library (no daemon: the manager connects to the
# hosts' libvirtd over qemu+ssh/qemu+tls) and runs as an unprivileged user.
# Nothing secret is built in: kubeconfig, host credentials and webhook certificates come from
# the cluster at run time (service account, Secrets, mounted volumes).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder -------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libvirt-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# The dependency set is pinned by constraints.txt (the same pins the test suite runs with).
COPY pyproject.toml constraints.txt README.md ./
COPY capl ./capl
RUN pip wheel --no-cache-dir --disable-pip-version-check \
        --constraint constraints.txt --wheel-dir /wheels .

# --- the manager -----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="capl" \
      org.opencontainers.image.description="Cluster API infrastructure provider for libvirt/KVM" \
      org.opencontainers.image.source="https://github.com/capl-dev/capl" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# libvirt0: the client library libvirt-python links against. openssh-client: libvirt runs
# `ssh` for qemu+ssh:// host URIs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libvirt0 openssh-client \
    && rm -rf /var/lib/apt/lists/*

# The wheels are bind-mounted from the builder, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /wheels capl \
    && capl version

RUN groupadd --system --gid 65532 capl \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/capl --create-home \
        --shell /usr/sbin/nologin capl

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /home/capl
USER 65532:65532
# metrics, health probes, webhooks
EXPOSE 8080 9440 9443
ENTRYPOINT ["capl", "manager"]
