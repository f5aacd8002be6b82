"""A bounds decision read back from the ledger is the decision written: the next automatic
choice averages over its means and histograms, so a restart must not lose them."""

from __future__ import annotations

from stream_dp.pipeline.formats.ledger import BoundsDecision, LedgerIndex, encode_bounds_decision


def test_a_bounds_decision_round_trips_through_the_ledger_whole() -> None:
    decision = BoundsDecision(
        window_start_s=3600,
        max_contributions_per_window=7,
        max_keys_per_user=3,
        max_contributions_per_key=None,
        chosen_from_s=0,
        reason="chosen",
        means={"visits": 2.5, "spend": 11.25},
        histograms={"counts": {"events": [1, 2, 3]}, "noise_scales": {"events": 2.0}},
    )
    index = LedgerIndex()
    index.feed(*encode_bounds_decision(decision))
    assert index.bounds == {3600: decision}
