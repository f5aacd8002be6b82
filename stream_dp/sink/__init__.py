"""The PostgreSQL sink: the output topic into tables that dashboards read.

- :mod:`~stream_dp.sink.rows` — output records → rows (pure);
- :mod:`~stream_dp.sink.batch` — one fetched batch, deduplicated, with its offsets (pure);
- :mod:`~stream_dp.sink.schema` — the tables and their migrations;
- :mod:`~stream_dp.sink.store` — one batch in one transaction, idempotently;
- :mod:`~stream_dp.sink.service` — the consumer loop (commit offsets after the database);
- :mod:`~stream_dp.sink.run` — the process: HTTP endpoints, signals (``stream-dp sink``);
- :mod:`~stream_dp.sink.metrics` — ``stream_dp_sink_*`` metrics.

psycopg is an optional dependency (the ``sink`` extra: ``pip install "psycopg[binary]>=3.1"``): only
:mod:`~stream_dp.sink.schema`, :mod:`~stream_dp.sink.store`, :mod:`~stream_dp.sink.service`
and :mod:`~stream_dp.sink.run` import it.
"""

from typing import Final

#: The sink session's PostgreSQL ``lock_timeout`` and ``statement_timeout`` by default (here,
#: free of psycopg, so that the CLI can show them without importing it): a lock held
#: elsewhere (a migration, a long report) or a hung statement fails the try, which is retried
#: with back-off, instead of stalling the sink.
LOCK_TIMEOUT_S: Final = 10.0
STATEMENT_TIMEOUT_S: Final = 120.0
