"""The PostgreSQL sink: the output topic into tables that dashboards read.

- :mod:`~stream_dp.sink.rows` — output records → rows (pure);
- :mod:`~stream_dp.sink.batch` — one fetched batch, deduplicated, with its offsets (pure);
- :mod:`~stream_dp.sink.schema` — the tables and their migrations;
- :mod:`~stream_dp.sink.store` — one batch in one transaction, idempotently;
- :mod:`~stream_dp.sink.service` — the consumer loop (commit offsets after the database);
- :mod:`~stream_dp.sink.run` — the process: HTTP endpoints, signals (``stream-dp sink``);
- :mod:`~stream_dp.sink.metrics` — ``stream_dp_sink_*`` metrics.

psycopg is an optional dependency (``pip install "stream-dp[sink]"``): only
:mod:`~stream_dp.sink.schema`, :mod:`~stream_dp.sink.store`, :mod:`~stream_dp.sink.service`
and :mod:`~stream_dp.sink.run` import it.
"""
