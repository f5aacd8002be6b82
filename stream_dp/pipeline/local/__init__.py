"""The in-memory transport: :class:`~.local.LocalPipeline` runs the same stages and release
driver without Kafka, for ``stream-dp replay`` (a JSON-lines file and a ledger file) and tests."""
