# specroute images. Two targets, one Dockerfile:
#
#   gateway (the default, the last stage): the product only, `specroute-gateway serve --config ...`.
#     It holds gateway/, policies/, backends/, common/ and the core lock: no twin, no evaluator, no
#     loadgen, no matplotlib or numpy.
#   twin: the SGLang-compatible simulator (`specroute sim`), for compose and the container tests.
#
#   docker build --target gateway -t specroute:0.1.0 .
#   docker build --target twin -t specroute-twin:0.1.0 .
#   docker run -p 127.0.0.1:8000:8000 -v "$PWD/etc:/etc/specroute:ro" specroute:0.1.0
#   docker run specroute-twin:0.1.0 sim --profile k26-dflash --host 0.0.0.0 --port 30000   # a twin backend
#
# Multi-stage (build tools stay in the build stages), pinned base, non-root, healthcheck on /ready.
# The config is read from a directory mount (/etc/specroute), not a single-file mount, so that a
# Kubernetes ConfigMap update reaches the running container. deploy/ has compose, Kubernetes and Helm.
#
# BASE: any Debian-family image with python3 (>= 3.11) and its venv module. The default is the
# official Python image: the newest 3.11 patch release (3.11 is what the suite, the locks and mypy
# run on; it has security fixes until 2027-10) on Debian 13 trixie, the current stable release
# (docs/deployment.md says why). The container tests build on a local debootstrap image instead
# (deploy/local/dockerhost.py), since no container registry is reachable there. Pin by digest as
# well (python:3.11.15-slim-trixie@sha256:...) where the registry is reachable to look it up.
ARG BASE=python:3.11.15-slim-trixie

# All stages use the same base: the venv is copied between them and points at the base's python3.
# BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 before): pip's cache lives in a
# cache mount, outside the layers, so a changed dependency list downloads only what changed.
FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python3 -m venv /opt/specroute
# Dependencies first, in a layer of their own: a source change rebuilds only the layers below. The core
# lock (requirements.lock: pip format, hashed) is what `pip install .` needs, nothing of the tooling's.
COPY requirements.lock ./
RUN --mount=type=cache,target=/root/.cache/pip /opt/specroute/bin/pip install -r requirements.lock
COPY pyproject.toml README.md LICENSE ./
COPY gateway ./gateway
COPY policies ./policies
COPY backends ./backends
COPY common ./common
# --no-deps: everything it needs is installed above (pip check proves it). setuptools' packages.find
# skips the folders that are not here, so the wheel holds the product only (and the LICENSE, in its
# metadata); the `specroute` and `loadgen` commands, which need the tooling, are removed. The smoke
# checks fail the build if the gateway's command does not start or a tooling package got in (-I: the
# installed package).
RUN /opt/specroute/bin/pip install --no-cache-dir --no-deps . \
 && /opt/specroute/bin/pip check \
 && rm /opt/specroute/bin/specroute /opt/specroute/bin/loadgen \
 && /opt/specroute/bin/specroute-gateway --version \
 && /opt/specroute/bin/python -I -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(p) for p in ('twin', 'evaluate', 'tools', 'loadgen', 'bench', 'matplotlib', 'numpy')))"

# The twin: the core venv plus the tools lock, the twin and the `specroute` command.
FROM build AS build-twin
COPY requirements-tools.lock ./
RUN --mount=type=cache,target=/root/.cache/pip /opt/specroute/bin/pip install -r requirements-tools.lock
COPY twin ./twin
COPY tools ./tools
RUN /opt/specroute/bin/pip install --no-cache-dir --no-deps . \
 && /opt/specroute/bin/pip check \
 && /opt/specroute/bin/specroute sim --list > /dev/null

FROM ${BASE} AS runtime
RUN groupadd --system --gid 10001 specroute \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin specroute
ENV PATH=/opt/specroute/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp

FROM runtime AS twin
LABEL org.opencontainers.image.title="specroute-twin" \
      org.opencontainers.image.description="SGLang-compatible simulated server (specroute's twin), for tests and demos" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-twin /opt/specroute /opt/specroute
USER 10001:10001
EXPOSE 30000
ENTRYPOINT ["specroute"]
CMD ["sim", "--profile", "k26-dflash", "--host", "0.0.0.0", "--port", "30000"]

FROM runtime AS gateway
LABEL org.opencontainers.image.title="specroute" \
      org.opencontainers.image.description="Speculative-decoding-aware OpenAI-compatible gateway for SGLang" \
      org.opencontainers.image.licenses="Apache-2.0"
# Root-owned and read-only for the service user: the code cannot be changed at run time.
COPY --from=build /opt/specroute /opt/specroute
USER 10001:10001
EXPOSE 8000
# /ready is cheap (no upstream call) and is 200 only when every served model has a backend up.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["specroute-gateway"]
CMD ["serve", "--listen", "0.0.0.0:8000", "--config", "/etc/specroute/specroute.toml"]
