"""The pipeline: consume → decode → pseudonymize → window → bound → close → release → publish.

- :mod:`.stages`: the three stages, pure of Kafka (stage 0 routing, stage 1 bounding and
  sealing, stage 2 merging, noise, selection and charging);
- :mod:`.formats`: the records of every topic and the indexes built from them (the ledger,
  the running-total state);
- :mod:`.release_driver`: the release protocol, written once against a small transport
  interface (:class:`~.release_driver.ReleaseTransport`);
- :mod:`.kafka`: the Kafka transport — the worker of named parts and the service;
- :mod:`.local`: the in-memory transport — ``replay`` and tests;
- :mod:`.fingerprint_gate`: what a deployment's recorded settings allow at start;
- :mod:`.faults`: test-only fault injection, a hook object that does nothing by default.
"""
