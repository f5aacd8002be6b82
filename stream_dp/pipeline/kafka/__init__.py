"""The Kafka transport: the worker and its named parts (membership, publisher, ledger
reader, topology watch, deployment records, stage output, the release transport), the
erasure worker, the ledger guard and rebuild, and the service that runs them."""
