# specroute image: the gateway (`specroute serve`) and the twin (`specroute sim`) in one image.
# Multi-stage (build tools stay in the first stage), pinned base, non-root, healthcheck on /ready.
#
#   docker build -t specroute:0.1.0 .
#   docker run -p 127.0.0.1:8000:8000 -v "$PWD/etc:/etc/specroute:ro" specroute:0.1.0
#   docker run specroute:0.1.0 sim --profile k26-dflash --host 0.0.0.0 --port 30000   # a twin backend
#
# The config is read from a directory mount (/etc/specroute), not a single-file mount, so that a
# Kubernetes ConfigMap update reaches the running container. deploy/ has compose, Kubernetes and Helm.
#
# BASE: any Debian-family image with python3 (>= 3.11) and its venv module. The default is the
# official Python image; the container tests build on a local debootstrap image instead
# (deploy/local/dockerhost.py), since no container registry is reachable there. Pin by digest as
# well (python:3.11.7-slim-bookworm@sha256:...) where the registry is reachable to look it up.
ARG BASE=python:3.11.7-slim-bookworm

# Both stages use the same base: the venv is copied between them and points at the base's python3.
# BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 before): pip's cache lives in a
# cache mount, outside the layers, so a changed dependency list downloads only what changed.
FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python3 -m venv /opt/specroute
# Dependencies first, in layers of their own: a source change rebuilds only the layers below. From the
# lock file when the repository has one (requirements.lock, pip format, hashed), else from
# pyproject.toml's [project] dependencies; with the lock, an edit of pyproject.toml alone (a dev tool,
# a comment) reruns only the second RUN, which then does nothing. The bracket glob lets COPY
# succeed when there is no lock.
COPY requirements.loc[k] ./
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -f requirements.lock ]; then /opt/specroute/bin/pip install -r requirements.lock; fi
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ ! -f requirements.lock ]; then \
      python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/deps.txt \
      && /opt/specroute/bin/pip install -r /tmp/deps.txt; \
    fi
COPY README.md ./
COPY gateway ./gateway
COPY backends ./backends
COPY policies ./policies
COPY loadgen ./loadgen
COPY common ./common
COPY twin ./twin
COPY evaluate ./evaluate
COPY tools ./tools
# --no-deps: everything it needs is installed above (pip check proves it). The smoke checks fail the
# build if data files (launch profiles) were left out of the package (-I: the installed package,
# not the sources in /src).
RUN /opt/specroute/bin/pip install --no-cache-dir --no-deps . \
 && /opt/specroute/bin/pip check \
 && /opt/specroute/bin/specroute --help > /dev/null \
 && /opt/specroute/bin/python -I -c "from tools.launch import list_recipes; list_recipes()"

FROM ${BASE}
LABEL org.opencontainers.image.title="specroute" \
      org.opencontainers.image.description="Speculative-decoding-aware OpenAI-compatible gateway for SGLang" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 specroute \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin specroute
# Root-owned and read-only for the service user: the code cannot be changed at run time.
COPY --from=build /opt/specroute /opt/specroute
ENV PATH=/opt/specroute/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /tmp
USER 10001:10001
EXPOSE 8000
# /ready is cheap (no upstream call) and is 200 only when every served model has a backend up.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["specroute"]
CMD ["serve", "--listen", "0.0.0.0:8000", "--config", "/etc/specroute/specroute.toml"]
