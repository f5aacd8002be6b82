"""Continual release: running totals over a horizon of T windows, with error growing like
log T instead of √T (issue #17).

Modules: :mod:`.binary_tree` (dyadic tree, Honaker's estimator), :mod:`.sqrt_factorization`
(the √-factorisation made exact for integer noise), :mod:`.planning` (calibration, the
guarantee, predicted error, the default), :mod:`.counter` (the streaming state and what to
persist). Horizons are in :mod:`stream_dp.windows.horizon`; record fields in
:func:`stream_dp.pipeline.formats.records.cumulative_release_fields`.

Scope: public keys only. Private keys would need partition selection over the whole horizon
(a key released once must stay released, as in DP-SQLP); the configuration refuses them.

Guarantee (details in :mod:`.planning`): a user adds at most the query's per-window
sensitivity to each window, in any number of the horizon's windows (k·T events at most over
the horizon, no other cap). For every set W of windows a user is in, the horizon's releases
are (|W|·ε)-DP (discrete Laplace) or (|W|·ρ)-zCDP (discrete Gaussian): each window is charged
the query's (ε, δ), as a per-window query is.

Integration into the streaming worker and replay
------------------------------------------------
:mod:`stream_dp.pipeline.stages.cumulative` (the release stage) and
:mod:`stream_dp.pipeline.formats.continual_state` (the internal continual topic) use this package:
per (query, window) they make one counter step (``make_counter`` / ``advance``), persist its
:class:`~.counter.WindowDraws` — exact totals included, so in an access-controlled topic,
not the ledger — read it back to a fence, and take the first complete draw in log order;
later windows (often on another worker) continue it through ``replay`` without drawing.
A running total starts at its horizon's start, or at the first window of it that is covered
(or at which the query's plan changed): each such chain is a counter of its own, with the
same plan. The module docstring of :mod:`stream_dp.pipeline.stages.cumulative` argues, case by
case (crashes at every point, two owners of one window, the next window's owner), why no
(key, window) ever gets two values and no published value depends on a redrawn node.
"""
