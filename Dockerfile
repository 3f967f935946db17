# syntax=docker/dockerfile:1
# The timeshard image: the `timeshard` command with the server extra (Cassandra, ZooKeeper,
# TLS certificates), run as uid 10001. deploy/kubernetes and compose.yaml use it.
#
#   docker build -t registry.example.com/timeshard:0.1.0 .
#   docker run --rm registry.example.com/timeshard:0.1.0 --version
#
# A worker image adds your handlers to it (docs/operations.md, "A worker image").
# tools/check_deploy.py lints this file (hadolint and the rules of check_dockerfile).

# -- build: the wheel of this checkout, installed with the server extra into /opt/timeshard --
# (hadolint looks for a HEALTHCHECK in each stage; this one never runs as a container)
# hadolint ignore=DL3057
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip wheel --no-deps --wheel-dir /dist . \
    && python -m venv /opt/timeshard \
    && /opt/timeshard/bin/pip install "$(ls /dist/timeshard-*.whl)[server]"

# -- run: the virtual environment only, no build tools, no root ------------------------------
FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --user-group --no-log-init \
    --home-dir /var/lib/timeshard --create-home timeshard
COPY --from=build /opt/timeshard /opt/timeshard
ENV PATH=/opt/timeshard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIMESHARD_HEALTH_URL=http://127.0.0.1:9464/readyz
USER 10001:10001
WORKDIR /var/lib/timeshard
# gRPC; metrics, the status page and /readyz (with --metrics-port 9464 --metrics-host 0.0.0.0)
EXPOSE 50051 9464
# Healthy while the node's health says SERVING (its store answers, its ZooKeeper session is
# live): /readyz on the metrics port, which needs no TLS or token. A worker has no /readyz:
# point TIMESHARD_HEALTH_URL at its --metrics-port's /metrics (compose.yaml does).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['TIMESHARD_HEALTH_URL'], timeout=3)"]
ENTRYPOINT ["timeshard"]
CMD ["--help"]
