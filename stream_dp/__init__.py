"""stream-dp: differentially private live statistics from event-level Kafka streams."""

__version__ = "0.1.0"
