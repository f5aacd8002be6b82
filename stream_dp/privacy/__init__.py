"""The privacy core: pure functions and small state objects, no Kafka and no asyncio.

The streaming worker, ``stream-dp replay``, ``stream-dp plan`` and the tests all call it.
"""
