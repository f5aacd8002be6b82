"""Mechanisms that choose by the exponential mechanism (issue 40).

Modules: :mod:`.sampler` (the exponential mechanism on integer utilities, drawn exactly from
the OS CSPRNG), :mod:`.top_k` (private top-k by peeling), :mod:`.quantiles` (private
quantiles of a histogram with OpenDP's score). docs/privacy-top-k-quantiles.md explains the
choices, the accounting and the plan figures.
"""
