"""Continual release: running totals over a horizon of T windows, with error growing like
log T instead of √T (issue #17).

Modules: :mod:`.binary_tree` (dyadic tree, Honaker's estimator), :mod:`.sqrt_factorization`
(the √-factorisation made exact for integer noise), :mod:`.planning` (calibration, the
guarantee, predicted error, the default), :mod:`.counter` (the streaming state and what to
persist). Horizons are in :mod:`stream_dp.windows.horizon`; record fields in
:func:`stream_dp.pipeline.records.cumulative_release_fields`.

Scope: public keys only. Private keys would need partition selection over the whole horizon
(a key released once must stay released, as in DP-SQLP); the configuration refuses them.

Guarantee (details in :mod:`.planning`): a user adds at most the query's per-window
sensitivity to each window, in any number of the horizon's windows (k·T events at most over
the horizon, no other cap). For every set W of windows a user is in, the horizon's releases
are (|W|·ε)-DP (discrete Laplace) or (|W|·ρ)-zCDP (discrete Gaussian): each window is charged
the query's (ε, δ), as a per-window query is.

Integration into the streaming worker (for the release stage and the ledger)
------------------------------------------------------------------------------
For a cumulative query ``q`` (``plan = plan_query(...).continual``, keys
``plan_query(...).public_keys``) and a due window starting at ``w``:

1. ``pos = horizon_position(w, window_size_s=S, horizon_windows=T,
   origin_s=query_plan.horizon_origin_s)``. One counter per (q, pos.horizon_start_s), made
   with ``make_counter(plan, keys)`` or rebuilt with ``restore_counter(plan, keys, draws)``
   from that horizon's persisted draws (never with a noise call).
2. Every window of a horizon must pass through the counter in order, including windows
   without events (totals 0 for every key): if ``counter.step < pos.step - 1``, advance
   through the missing windows first and release them too.
3. If the store already holds the draws of ``pos.step`` (a crash after persisting them and
   before the ledger write), the restored counter's values *are* that window's values: do
   not advance. Otherwise ``st = counter.advance(totals)`` with ``totals[i]`` the window's
   exact bounded total of ``keys[i]`` (``events`` for count, ``value_sum`` for sum; 0 when
   absent).
4. Persist ``st.draws`` (``to_json()``, split with :func:`.counter.split_draws` for large key
   lists) keyed ``<query>|<horizon_start>|<step>|part-<i>``, latest per key wins, and wait
   for the acknowledgement — before the ledger record of (q, w). The draws hold the window's
   exact totals (``exact_totals``): put them where the partials may go (an access-controlled
   compacted internal topic such as ``<group_id>.continual``), not in a store that is read
   like the output topic. ``per_window_sum`` draws hold no exact totals.
5. Ledger and publish as for a per-window release: one record per key with
   ``value = int(st.values[i])`` for a count and ``float(st.values[i]) * plan.unit`` for a sum
   (as per-window releases do), ``noise_scale=plan.draw_scale``,
   ``ci95=plan.ci95(pos.step)``, ``extra=cumulative_release_fields(plan, pos)``; charge the
   query's (ε, δ) to the window through the accountant as now (no new accounting rule).
6. At start (or when a horizon's windows move to this worker), rebuild counters from the
   store. For the last ledgered step the restored values must equal the ledger's values;
   a mismatch is a bug: stop without publishing or drawing.
7. After a horizon's last window is published, its draws may be deleted (tombstones).

What a kill -9 does, at each point: before the draws are acknowledged — nothing of that
window was persisted or published, so on restart it is drawn afresh (nobody saw the lost
draw; the same argument as a ledger part without its siblings). After the draws, before the
ledger — the restart restores through that step and derives exactly those values (step 3),
ledgers and publishes them. After the ledger — the existing republish path. So one (key,
window) never gets two different values, and no published window's node is drawn twice.

Ownership: a horizon's windows must be advanced by one owner, in order. Route a cumulative
query's windows to the partials/ledger partition by (query, horizon start) rather than by
(query, window start), or make window t wait until the draws of t − 1 are in the store.

Replay (``stream-dp replay``) runs the same steps with an in-memory store: same horizons,
steps, options, scales and intervals as the worker; the values differ only by the noise, and
given the worker's persisted draws :func:`.counter.restore_counter` reproduces the worker's
values exactly. Until this wiring exists, :class:`stream_dp.pipeline.queries.CompiledQuery`
refuses cumulative queries at start (remove that guard when wiring).
"""
