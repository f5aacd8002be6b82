"""The pipeline's stages, pure of Kafka: stage 0 routing (:mod:`.router`), stage 1
bounding and sealing (:mod:`.ingest` with its record and column paths), stage 2 merging,
noise and selection (:mod:`.release_stage` with its inbox, cursors, charges, automatic bounds
and running totals)."""
