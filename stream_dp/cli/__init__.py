"""The ``stream-dp`` command line: one module per subcommand, each with ``register()``."""
