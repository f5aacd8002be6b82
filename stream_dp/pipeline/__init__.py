"""The worker: consume → decode → pseudonymize → window → bound → close → release → publish.

``engine`` holds every step that does not touch Kafka; ``worker`` (aiokafka) and ``replay``
(a JSON-lines file) are its two transports.
"""
