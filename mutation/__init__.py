"""Mutation testing of the privacy-critical modules: `make mutate` (mutmut) and its report."""
