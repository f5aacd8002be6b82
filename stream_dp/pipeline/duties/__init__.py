"""The data holder's duties (docs/records.md): the records of processing (``stream-dp
records``) and the right of access (``stream-dp access``), read from a deployment's topics."""
