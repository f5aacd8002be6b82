"""The records of each topic: input decoding and dead letters, output and internal record
encodings, and the indexes built from the ledger and the continual topic."""
