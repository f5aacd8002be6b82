"""Kafka clients for the command-line tools around the worker (``demo``, ``produce``,
``tail``): a batched, throttled event producer and a reader that groups the output topic's
records into one release per (query, window). They know the record formats, not DP."""

from stream_dp.clients.output import OutputAssembler, OutputReader, WindowGroup
from stream_dp.clients.producer import ProduceReport, produce_records

__all__ = ["OutputAssembler", "OutputReader", "ProduceReport", "WindowGroup", "produce_records"]
