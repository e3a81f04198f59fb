# specroute gateway image: multi-stage, pinned base, non-root, healthcheck on /health.
# Build: docker build -t specroute .   Run: docker run -p 8000:8000 -v $PWD/specroute.toml:/etc/specroute.toml specroute
FROM python:3.11.7-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY backends ./backends
COPY policies ./policies
COPY loadgen ./loadgen
RUN python -m venv /opt/specroute \
 && /opt/specroute/bin/pip install --no-cache-dir --disable-pip-version-check .

FROM python:3.11.7-slim-bookworm
RUN useradd --system --uid 10001 --no-create-home specroute
COPY --from=build /opt/specroute /opt/specroute
ENV PATH=/opt/specroute/bin:$PATH PYTHONUNBUFFERED=1
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["specroute", "serve", "--listen", "0.0.0.0:8000"]
CMD ["--config", "/etc/specroute.toml"]
