# A local stand-in for prom/prometheus where no container registry is reachable: Debian's own
# prometheus package on the project's base image (deploy/local/dockerhost.py makes that base).
# deploy/compose.local.yml builds it; the real image stays the default in deploy/docker-compose.yml.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o prometheus -g prometheus /var/lib/prometheus/data
# The package's own user and data directory; the compose command line sets the config file.
USER prometheus
WORKDIR /var/lib/prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/var/lib/prometheus/data"]
