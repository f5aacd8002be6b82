# stream-dp worker image: `docker build -t stream-dp .`, then `docker run stream-dp run --config ...`.
# Two stages: build a wheel, then install it into a clean slim image that runs as non-root.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY stream_dp ./stream_dp
# The sink extra brings psycopg (`stream-dp sink`); the worker does not need it.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[sink]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 streamdp \
 && useradd --system --uid 10001 --gid streamdp --no-create-home --shell /usr/sbin/nologin streamdp
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Topic definitions (`stream-dp topics apply` and `run` create topics from them) are not in
# the wheel: copy them and point STREAM_DP_TOPICS_DIR at them. Examples come along for `plan`.
WORKDIR /opt/stream-dp
COPY topics ./topics
COPY examples ./examples
ENV STREAM_DP_TOPICS_DIR=/opt/stream-dp/topics
USER streamdp:streamdp
# Prometheus metrics and health endpoints of the worker (9108) and the sink (9109); config:
# metrics.host must be 0.0.0.0 in a container.
EXPOSE 9108 9109
# No HEALTHCHECK here: the same image runs one-shot commands (topics apply, produce) too;
# docker-compose.yml gives the worker service its health check on /health/live.
ENTRYPOINT ["stream-dp"]
CMD ["--help"]
