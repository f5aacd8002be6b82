"""The privacy core: pure functions and small state objects, no Kafka and no asyncio.

The streaming worker, ``stream-dp replay``, ``stream-dp plan`` and the tests all call it.
It imports nothing of stream-dp but itself and :mod:`stream_dp.errors` (checked by
``lint-imports`` in ``make lint``): the configuration builds the frozen specs the planner
takes (:mod:`stream_dp.privacy.specs`).
"""
