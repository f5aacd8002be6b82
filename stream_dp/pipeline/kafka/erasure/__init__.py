"""The worker's erasure side: the compacted erasure log, and the requests it serves."""
