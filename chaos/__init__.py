"""The chaos run: three workers, a live producer and random faults on the embedded broker.

``python -m chaos.run --minutes 20`` (``make chaos``) writes ``chaos/REPORT.md`` and
``chaos/rss.png``; ``--minutes 2 --smoke`` is the short form ``make test`` runs.
"""
