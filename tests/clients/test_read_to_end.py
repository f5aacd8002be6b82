"""Placing fetch answers on the monotonic clock (idleness is proven by them)."""

from __future__ import annotations

from stream_dp.clients.read_to_end import answered_at_mono


def test_an_answer_is_placed_by_its_age() -> None:
    assert answered_at_mono(answered_wall_s=1_000.0, now_wall_s=1_002.5, now_mono_s=50.0) == 47.5


def test_an_answer_stamped_ahead_of_the_clock_proves_nothing() -> None:
    """The wall clock was set back after the answer: taking it as "now" would prove silence
    afresh on every iteration while the reader stalls, and the stalled partition's events
    would become late. It is not placed at all; the next answer (stamped after the jump) is."""
    assert answered_at_mono(answered_wall_s=5_000.0, now_wall_s=1_000.0, now_mono_s=50.0) is None
    assert answered_at_mono(answered_wall_s=999.75, now_wall_s=1_000.0, now_mono_s=50.25) == 50.0
