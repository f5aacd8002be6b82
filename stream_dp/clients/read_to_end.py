"""When a consumer last knew it had read a partition to its end.

Idleness must be proven, not inferred from silence: a consumer that cannot fetch (a broker
stall, a partition paused while it is taken, a member out of its group) also delivers
nothing. aiokafka stamps every fetch answer it accepts for a partition (records or not) with
the time and the partition's high watermark; when the consumer's position has reached that
watermark, everything the partition held at that time has been read.

The position and the stamp come from aiokafka's assignment state (its public ``position``
is a coroutine that may wait for a reset, and ``last_poll_timestamp`` says nothing of the
position): an aiokafka that changes these internals makes this return None, so idleness is
never proven and windows wait — never close early.
"""

from __future__ import annotations

from typing import Any

from stream_dp.kafka_client import TopicPartition


def read_to_end_at(consumer: Any, tp: TopicPartition) -> float | None:
    """Wall-clock time (s) of the last fetch answer after which ``consumer`` has read ``tp``
    up to its high watermark; None while it is behind, or when it cannot tell."""
    try:
        assignment = consumer._subscription.subscription.assignment
        state = assignment.state_value(tp)
        if state is None or not state.has_valid_position:
            return None
        highwater, stamp_ms, position = state.highwater, state.timestamp, state.position
    except AttributeError:
        return None
    if highwater is None or stamp_ms is None or position is None or position < highwater:
        return None
    return float(stamp_ms) / 1000.0


def answered_at_mono(answered_wall_s: float, now_wall_s: float, now_mono_s: float) -> float | None:
    """A fetch answer's wall-clock stamp on the monotonic clock; None when the stamp is
    ahead of the wall clock now (the clock was set back): such a stamp cannot be placed,
    and taking it as "now" would prove silence afresh on every call while the reader
    stalls. Answers stamped after the jump are placed again, a fetch interval later."""
    age_s = now_wall_s - answered_wall_s
    if age_s < 0:
        return None
    return now_mono_s - age_s
