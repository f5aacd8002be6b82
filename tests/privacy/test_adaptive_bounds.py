"""Automatic bounds, the privacy core (stream_dp/privacy/adaptive_bounds.py): bins, the
sensitivity of the histograms, their noise, the estimates read from them and the choice.

Statistical checks state their false-failure probability (chi-square p-value threshold
1e-7); everything else is exact.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from stream_dp.errors import PrivacyError
from stream_dp.privacy import adaptive_bounds
from stream_dp.privacy.adaptive_bounds import (
    EVENTS,
    NEXT_WINDOW_SPREAD,
    AutoSpec,
    Distribution,
    QueryModel,
    UserHistograms,
    bin_of,
    candidates,
    check_counts,
    choose_bounds,
    fitted_counts,
    geometric_edges,
    make_layout,
    merge_counts,
    noise_scales,
    release_histograms,
    trend_stretch,
)
from stream_dp.privacy.mechanisms import DiscreteLaplace

P_THRESHOLD = 1e-7


def _layout(k_cap: int = 1000, keyed: bool = True, projections: int = 1):
    return make_layout(
        k_cap=k_cap,
        keys_cap=64 if keyed else None,
        per_key_cap=1000 if keyed else None,
        projections={f"p{i}": (f"q{i}",) for i in range(projections)},
        events=True,
    )


# ------------------------------------------------------------------------------ bins


def test_edges_double_up_to_the_cap_which_is_the_last_edge() -> None:
    assert geometric_edges(1000) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
    assert geometric_edges(64, exact_up_to=8) == (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
    assert geometric_edges(64) == (1, 2, 4, 8, 16, 32, 64)
    assert geometric_edges(1) == (1,)
    assert geometric_edges(3) == (1, 2, 3)
    with pytest.raises(ValueError, match="cap"):
        geometric_edges(0)


@given(st.integers(1, 5000), st.integers(1, 20_000))
def test_a_value_falls_in_the_bin_whose_edges_surround_it(cap: int, value: int) -> None:
    edges = geometric_edges(cap)
    i = bin_of(edges, value)
    assert edges[i] <= value
    assert i == len(edges) - 1 or value < edges[i + 1]


def test_candidates_are_fine_below_16_then_about_19_percent_apart_up_to_the_cap() -> None:
    values = candidates(1000)
    assert values[:16] == list(range(1, 17))
    assert values[-1] == 1000
    ratios = [b / a for a, b in itertools.pairwise(values[15:-1])]
    assert all(1.1 < r < 1.3 for r in ratios)
    assert candidates(5) == [1, 2, 3, 4, 5]


# ----------------------------------------------------------------------- sensitivity


LAYOUTS = {
    "events, keys, per_key": dict(keys_cap=64, per_key_cap=1000, events=True),
    "events, keys": dict(keys_cap=64, per_key_cap=None, events=True),
    "keys, per_key": dict(keys_cap=64, per_key_cap=1000, events=False),
    "events": dict(keys_cap=None, per_key_cap=None, events=True),
}


@pytest.mark.parametrize("layout_name", sorted(LAYOUTS))
@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 1500), st.lists(st.integers(1, 900), max_size=80)),
        max_size=30,
    ),
    st.integers(1, 1500),
    st.lists(st.integers(1, 900), max_size=80),
)
def test_one_user_moves_exactly_one_bin_of_each_histogram_by_one(
    layout_name: str, others: list[tuple[int, list[int]]], events: int, key_counts: list[int]
) -> None:
    # The neighbours of docs/privacy.md#unit-of-privacy: add or remove all events of one user.
    # The histograms of the stream with the user differ from those without in exactly one bin of
    # each histogram (the events one always; the keyed ones when the user has an event in the
    # projection), whichever histograms the configuration releases.
    layout = make_layout(k_cap=1000, projections={"p0": ("q0",)}, **LAYOUTS[layout_name])
    seed = 7

    def histograms(users: list[tuple[int, list[int]]]) -> dict[str, list[int]]:
        h = UserHistograms(layout, random.Random(seed))
        for n, counts in users:
            h.add_user(n, {"p0": counts})
        return h.counts()

    without = histograms(others)
    with_user = histograms([*others, (events, key_counts)])
    moved = {
        name: sum(abs(a - b) for a, b in zip(with_user[name], without[name], strict=True))
        for name in layout.names
    }
    expected_keyed = 1 if key_counts else 0
    assert moved == {n: 1 if n == "events" else expected_keyed for n in layout.names}
    assert sum(moved.values()) <= layout.count  # the L1 sensitivity the noise is scaled to


def test_partition_histograms_add_up_to_the_windows() -> None:
    layout = _layout(keyed=False)
    rng = random.Random(1)
    parts = []
    whole = UserHistograms(layout, rng)
    for users in ([3, 40, 999], [1, 1, 5000]):
        h = UserHistograms(layout, rng)
        for n in users:
            h.add_user(n, {})
            whole.add_user(n, {})
        parts.append(h.counts())
    assert merge_counts(layout, parts) == whole.counts()


def test_histograms_of_another_layout_are_refused() -> None:
    layout = _layout(keyed=False)
    good = {EVENTS: [0] * len(layout.edges[EVENTS])}
    check_counts(layout, good)
    with pytest.raises(PrivacyError, match="layout"):
        check_counts(layout, {**good, "keys/p0": [0]})
    with pytest.raises(PrivacyError, match="bins"):
        check_counts(layout, {EVENTS: [0] * (len(layout.edges[EVENTS]) + 1)})
    with pytest.raises(PrivacyError, match="bins"):
        check_counts(layout, {EVENTS: [-1] + [0] * (len(layout.edges[EVENTS]) - 1)})


# ----------------------------------------------------------------------------- noise


def test_noise_scale_is_the_number_of_histograms_over_epsilon_exactly() -> None:
    layout = _layout(projections=2)  # events + 2 × (keys, per_key): H = 5
    assert layout.count == 5
    assert noise_scales(layout, 0.1) == {n: 5 / 0.1 for n in layout.names}
    assert layout.describe()["l1_sensitivity"] == 5
    released = release_histograms(
        {n: [0] * len(layout.edges[n]) for n in layout.names}, layout, epsilon=0.25
    )
    assert released.scales == {n: 20.0 for n in layout.names}
    assert released.epsilon == 0.25
    assert {n: len(v) for n, v in released.counts.items()} == layout.sizes()


def test_every_bin_gets_discrete_laplace_noise_of_the_stated_scale() -> None:
    # false failure ≤ 1e-7 (chi-square p-value threshold): 60,000 bins' noise against the
    # pmf of scale H/ε = 3 (H = 3, ε = 1)
    layout = _layout()
    exact = {n: [5] * len(layout.edges[n]) for n in layout.names}
    noise: list[int] = []
    while len(noise) < 60_000:
        released = release_histograms(exact, layout, epsilon=1.0)
        noise.extend(v - 5 for n in layout.names for v in released.counts[n])
    mech = DiscreteLaplace(3.0)
    observed = Counter(max(-15, min(15, z)) for z in noise)
    support = range(-15, 16)
    probs = [mech.pmf(z) for z in support]
    probs[0] = mech.tail(15)  # P(Z ≤ -15)
    probs[-1] = mech.tail(15)
    expected = np.array(probs) * len(noise)
    result = chisquare(
        [observed.get(z, 0) for z in support], expected * len(noise) / expected.sum()
    )
    assert result.pvalue > P_THRESHOLD


# ------------------------------------------------------------------------- estimates


def test_excess_is_exact_when_values_are_uniform_within_their_bins() -> None:
    edges = geometric_edges(64)
    values = [v for lo, hi in itertools.pairwise(edges) for v in range(lo, hi)]
    values += [64, 64]  # the open last bin, at the cap
    counts = [0] * len(edges)
    for v in values:
        counts[bin_of(edges, v)] += 1
    dist = Distribution(edges, tuple(float(c) for c in counts))
    for c in [1, 2, 3, 5, 9, 17, 40, 63, 64, 70]:
        assert dist.excess(c) == pytest.approx(sum(max(0, v - c) for v in values))
    assert dist.total == pytest.approx(sum(values))
    doubled = Distribution(edges, dist.counts, stretch=2.0)
    for c in [4, 10, 33, 100]:
        assert doubled.excess(c) == pytest.approx(sum(max(0, 2 * v - c) for v in values))


def test_fitted_counts_keep_clear_counts_and_drop_noise_above_the_support() -> None:
    scale = 10.0  # sd ≈ 14 per bin
    counts = [500, 300, 200, 100, 90, 0, 0, 0, 0, 0, 0]
    assert fitted_counts(counts, scale=scale) == pytest.approx(counts)
    noisy = [500, 300, 200, 100, 90, 9, -12, 15, -3, 20, 11]  # pure noise from bin 5 up
    fitted = fitted_counts(noisy, scale=scale)
    assert fitted[5:] == [0.0] * 6
    # mass too small to place (40 users, under 2 sd of the noise of the 7 bins above bin
    # 3) is kept, at the highest bin where the tail is significant
    faint = fitted_counts([500, 300, 200, 100, 40, 0, 0, 0, 0, 0, 0], scale=scale)
    assert faint == pytest.approx([500, 300, 200, 140, 0, 0, 0, 0, 0, 0, 0])
    assert all(v >= 0 for v in fitted)
    tails = [sum(fitted[i:]) for i in range(len(fitted))]
    assert tails == sorted(tails, reverse=True)


def test_trend_is_the_ratio_of_the_windows_clamped_to_a_factor_of_two() -> None:
    assert trend_stretch(12.0, 8.0) == 1.5
    assert trend_stretch(100.0, 8.0) == 2.0
    assert trend_stretch(1.0, 8.0) == 0.5
    assert trend_stretch(5.0, None) == 1.0
    assert trend_stretch(5.0, 0.0) == 1.0
    # a window whose quantile is 0 says nothing of the trend; values below 1 still do
    assert trend_stretch(0.0, 4.0) == 1.0
    assert trend_stretch(0.75, 1.0) == 0.75
    assert trend_stretch(1.0, 0.6) == pytest.approx(1 / 0.6)


# ---------------------------------------------------------------------------- choice


def _count_model(epsilon_noise: float, keys: int | None = 10) -> QueryModel:
    return QueryModel(
        name="q",
        projection="p0",
        distinct_users=False,
        mechanism="discrete_laplace",
        scale_per_sensitivity=1 / epsilon_noise,
        public_keys=keys,
    )


def _noise_free(exact: dict[str, list[int]], layout):  # ε so large the noise is 0
    released = release_histograms(exact, layout, epsilon=1e7)
    assert dict(released.counts) == {n: tuple(v) for n, v in exact.items()}
    return released


@pytest.mark.parametrize("spread", [(1.0,), NEXT_WINDOW_SPREAD], ids=["as-read", "spread"])
@pytest.mark.parametrize(("heavy_per_value", "region"), [(0, (64, 128)), (1, (256, 512))])
def test_k_alone_minimises_the_exact_bias_plus_noise(
    heavy_per_value: int,
    region: tuple[int, int],
    spread: tuple[float, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Bias−variance (Amin et al. 2019): J(k) = Σ max(0, n_u − k)/K + E|Z(k)| falls while
    # more than about K/ε users lie above k and rises after. 10 keys, ε = 0.5: K/ε = 20.
    # Values spread evenly over the integers of their bins (the estimator's assumption), so
    # the estimate is exact and the choice must be the brute-force minimum over the
    # candidates: with no heavy users it lies among the 192 users of 64…127 (up to 128);
    # with one user on each of 256…511 (256 users, more than 20) k goes up among them.
    # With the next window's spread the bias is averaged over the values read s times
    # larger (Σ max(0, s·n_u − k)), which moves k up, never down.
    monkeypatch.setattr(adaptive_bounds, "NEXT_WINDOW_SPREAD", spread)
    layout = make_layout(k_cap=1000, keys_cap=None, per_key_cap=None, projections={}, events=True)
    values = [v for v in range(4, 8) for _ in range(2500)]
    values += [v for v in range(64, 128) for _ in range(3)]
    values += [v for v in range(256, 512) for _ in range(heavy_per_value)]
    h = UserHistograms(layout, random.Random(0))
    for n in values:
        h.add_user(n, {})
    choice = choose_bounds(
        _noise_free(h.counts(), layout),
        layout,
        spec=AutoSpec(frozenset({"k"}), k=1000, l0=None, linf=None),
        current=(40, None, None),
        queries=[_count_model(0.5)],
        released={},
    )

    def exact_j(k: int) -> float:
        bias = sum(sum(max(0.0, s * v - k) for v in values) for s in spread) / len(spread) / 10
        return bias + 1 / math.sinh(0.5 / k)  # E|Z| of discrete Laplace, b = k/0.5

    best = min(candidates(1000), key=exact_j)
    assert choice.reason == "min_expected_error"
    assert choice.bounds == (best, None, None)
    if spread == (1.0,):
        assert region[0] <= best <= region[1]
    else:
        assert region[0] <= best <= region[1] * max(spread)
    assert choice.objective == pytest.approx(exact_j(best))


def test_a_window_without_enough_users_keeps_its_bounds() -> None:
    layout = _layout()
    empty = {n: [0] * len(layout.edges[n]) for n in layout.names}
    choice = choose_bounds(
        release_histograms(empty, layout, epsilon=0.1),
        layout,
        spec=AutoSpec(frozenset({"k", "l0", "linf"}), k=1000, l0=64, linf=1000),
        current=(40, 5, 10),
        queries=[_count_model(0.45)],
        released={"q": [100.0, 200.0, 300.0]},
    )
    assert choice.bounds == (40, 5, 10)
    assert choice.reason.startswith("kept")


@pytest.mark.parametrize(
    ("spread", "expected"),
    [((1.0,), (40, 3, 1)), (NEXT_WINDOW_SPREAD, (40, 4, 2))],
    ids=["as-read", "spread"],
)
def test_keys_per_user_pick_l0_and_per_key_counts_pick_linf(
    spread: tuple[float, ...], expected: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20,000 users each touching 3 keys with 1 event on each: nothing to drop at L0 ≥ 3
    # and Linf ≥ 1, and anything larger only adds noise (k is fixed at 40 here). Read as
    # they are, L0 = 3 and Linf = 1; with the next window's spread, values a quarter higher
    # (3.75 keys, 1.25 events per key) are possible and cost far more bias than one more
    # key or event of sensitivity costs noise: L0 = 4, Linf = 2.
    monkeypatch.setattr(adaptive_bounds, "NEXT_WINDOW_SPREAD", spread)
    layout = make_layout(
        k_cap=40, keys_cap=40, per_key_cap=40, projections={"p0": ("q",)}, events=False
    )
    h = UserHistograms(layout, random.Random(0))
    for _ in range(20_000):
        h.add_user(3, {"p0": [1, 1, 1]})
    choice = choose_bounds(
        _noise_free(h.counts(), layout),
        layout,
        spec=AutoSpec(frozenset({"l0", "linf"}), k=40, l0=40, linf=40),
        current=(40, 5, 10),
        queries=[_count_model(0.5)],
        released={"q": [1000.0] * 5},
    )
    # keys per user have exact bins up to 8, so L0 is chosen to the key
    assert choice.bounds == expected


def test_the_choice_is_deterministic_post_processing_of_the_release() -> None:
    layout = _layout()
    rng = random.Random(3)
    h = UserHistograms(layout, rng)
    for _ in range(5000):
        n = int(rng.paretovariate(1.2) * 3)
        h.add_user(min(n, 1000), {"p0": [max(1, n // 2), max(1, n - n // 2)]})
    released = release_histograms(h.counts(), layout, epsilon=0.3)
    kwargs = {
        "spec": AutoSpec(frozenset({"k", "l0", "linf"}), k=1000, l0=64, linf=1000),
        "current": (40, 5, 10),
        "queries": [_count_model(0.45)],
        "released": {"q": [500.0] * 20},
    }
    first = choose_bounds(released, layout, **kwargs)  # type: ignore[arg-type]
    again = choose_bounds(released, layout, **kwargs)  # type: ignore[arg-type]
    assert first == again
    assert math.isfinite(first.objective or math.nan)


def test_the_largest_trend_and_spread_never_choose_beyond_the_caps() -> None:
    # Every user at the caps, and a window before that read 100× smaller: the trend (×2) and
    # the top of the next window's spread (×1.25) read the values far above the caps. The
    # bounds, which set the next window's noise and reservoir, still stay within them.
    layout = make_layout(
        k_cap=200, keys_cap=16, per_key_cap=50, projections={"p0": ("q",)}, events=True
    )
    h = UserHistograms(layout, random.Random(0))
    for _ in range(5000):
        h.add_user(200, {"p0": [50] * 4})
    noisy = _noise_free(h.counts(), layout)
    kwargs = {
        "spec": AutoSpec(frozenset({"k", "l0", "linf"}), k=200, l0=16, linf=50),
        "current": (40, 5, 10),
        "queries": [_count_model(0.45)],
        "released": {"q": [1e6] * 20},
    }
    first = choose_bounds(noisy, layout, **kwargs)  # type: ignore[arg-type]
    smaller = {n: v / 100 for n, v in first.means.items()}
    choice = choose_bounds(
        noisy,
        layout,
        means_before=smaller,
        previous=noisy,
        **kwargs,  # type: ignore[arg-type]
    )
    k, l0, linf = choice.bounds
    assert k <= 200 and l0 is not None and l0 <= 16 and linf is not None and linf <= 50


def test_a_user_with_no_kept_event_is_counted_in_no_histogram() -> None:
    """Only users with events are counted: the events histogram's bins start at one event,
    and a user whose events were all left out (or erased) is not a user of the window."""
    h = UserHistograms(_layout(), random.Random(3))
    h.add_user(0, {})
    h.add_user(0, {"p0": []})
    assert all(c == 0 for counts in h.counts().values() for c in counts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-50, 50), max_size=30))
def test_the_fit_is_the_least_squares_non_increasing_sequence(values: list[int]) -> None:
    """Pool adjacent violators against scipy's isotonic regression (an independent solver)."""
    from scipy.optimize import isotonic_regression

    fitted = adaptive_bounds._pava_non_increasing(values)
    if not values:
        assert fitted == []
        return
    expected = isotonic_regression(np.array(values, dtype=np.float64), increasing=False).x
    np.testing.assert_allclose(fitted, expected, rtol=1e-12, atol=1e-12)


def test_events_and_keys_alone_split_the_histogram_budget_toward_events() -> None:
    """With events and keys per user only, k is decided in the sparse tail of events per
    user, so that histogram gets the larger share of ε_h; the shares still add up to ε_h."""
    layout = make_layout(
        k_cap=1000, keys_cap=64, per_key_cap=None, projections={"p0": ("q0",)}, events=True
    )
    scales = noise_scales(layout, epsilon=0.2)
    assert set(scales) == {"events", "keys/p0"}
    assert scales["events"] < scales["keys/p0"]  # less noise: a larger share of ε_h
    assert sum(1 / b for b in scales.values()) == pytest.approx(0.2)


def test_values_that_grew_since_the_window_before_raise_the_next_bound() -> None:
    """The next window is expected to move on as this one did: when the values read now are
    twice those the window before read, the choice reads them stretched by that trend and
    picks a larger k than from the same histograms with no history."""
    layout = make_layout(k_cap=1000, keys_cap=None, per_key_cap=None, projections={}, events=True)
    h = UserHistograms(layout, random.Random(0))
    for n in [v for v in range(4, 8) for _ in range(2500)] + [
        v for v in range(64, 128) for _ in range(3)
    ]:
        h.add_user(n, {})
    kwargs = {
        "spec": AutoSpec(frozenset({"k"}), k=1000, l0=None, linf=None),
        "current": (40, None, None),
        "queries": [_count_model(0.5)],
        "released": {},
    }
    noisy = _noise_free(h.counts(), layout)
    flat = choose_bounds(noisy, layout, **kwargs)  # type: ignore[arg-type]
    grown = choose_bounds(
        noisy,
        layout,
        means_before={"events": flat.means["events"] / 2},
        **kwargs,  # type: ignore[arg-type]
    )
    assert flat.reason == grown.reason == "min_expected_error"
    assert grown.bounds[0] > flat.bounds[0]


def test_capped_excess_is_what_each_bound_drops_once_the_reservoir_kept_k() -> None:
    """Σ_u max(0, min(v_u, k) − c) for every k and bound c, by brute force over users
    whose values are exact (bins one value wide), and nothing for c = 0 (bound not set)."""
    edges = tuple(range(1, 13))  # every value its own bin; 12 is the cap (open last bin)
    values = [1, 1, 2, 3, 3, 3, 5, 7, 8, 8, 9]  # none above 9: bound 10 drops nothing
    counts = [0.0] * len(edges)
    for v in values:
        counts[bin_of(edges, v)] += 1
    dist = Distribution(edges, tuple(counts))
    ks = np.array([1, 4, 8, 12], dtype=np.int64)
    bounds = np.array([0, 1, 3, 4, 8, 10, 12], dtype=np.int64)
    out = adaptive_bounds._capped_excess(dist, bounds, ks)
    for i, k in enumerate(ks.tolist()):
        for j, c in enumerate(bounds.tolist()):
            expected = 0 if c == 0 else sum(max(0, min(v, k) - c) for v in values)
            assert out[i, j] == pytest.approx(expected, abs=1e-9), (k, c)


def test_mean_abs_noise_is_the_expected_absolute_draw_of_each_mechanism() -> None:
    """E|Z| by summation of the pmfs: exact for discrete Laplace (below and above scale
    1), and within 0.1% for the discrete Gaussian once σ ≥ 10 (where it is σ·√(2/π))."""
    z = np.arange(-4000, 4001)
    laplace_scales = np.array([0.3, 0.5, 2.0, 40.0])
    expected = [
        float(np.sum(np.abs(z) * np.array([DiscreteLaplace(b).pmf(int(v)) for v in z])))
        for b in laplace_scales
    ]
    got = adaptive_bounds.mean_abs_noise("discrete_laplace", laplace_scales)
    assert got == pytest.approx(expected, rel=1e-9)
    sigmas = np.array([10.0, 40.0, 150.0])
    weights = [np.exp(-(z * z) / (2 * s * s)) for s in sigmas]
    expected = [float(np.sum(np.abs(z) * w) / np.sum(w)) for w in weights]
    got = adaptive_bounds.mean_abs_noise("discrete_gaussian", sigmas)
    assert got == pytest.approx(expected, rel=1e-3)


def test_count_l2_squared_is_the_largest_sum_of_squares_a_user_can_reach() -> None:
    """A user with ≤ k events on ≤ L0 keys, ≤ Linf on each, moves the count vector by at
    most this much in squared ℓ2: checked against every way to place the events."""

    def brute(k: int, l0: int, linf: int) -> int:
        best = 0
        for split in itertools.product(range(linf + 1), repeat=l0):
            if sum(split) <= k:
                best = max(best, sum(c * c for c in split))
        return best

    cases = [(k, l0, linf) for k in range(1, 10) for l0 in range(1, 5) for linf in range(1, 6)]
    k, l0, linf = (np.array(c, dtype=np.int64) for c in zip(*cases, strict=True))
    got = adaptive_bounds._count_l2_squared(k, l0, linf)
    assert got.tolist() == [brute(*c) for c in cases]


def test_selection_loss_is_each_keys_drop_probability_times_its_value() -> None:
    """Σ over released keys of P(the key is dropped at this L0) × its value, the key's
    users read off its value over the events per user (rounded, at least 0; events per
    user at least 1), negative values counting as 0."""

    def keep(l0: int, users: int) -> float:
        return min(1.0, users / (4 * l0))

    model = QueryModel(
        name="q",
        projection="p",
        distinct_users=False,
        mechanism="discrete_laplace",
        scale_per_sensitivity=1.0,
        public_keys=None,
        keep_probability=keep,
    )
    values = [-3.0, 0.0, 1.0, 6.0, 9.0, 40.0]
    for l0, per_user in [(1, 1.0), (2, 3.0), (3, 0.5)]:
        users = [max(0, round(max(0.0, v) / max(1.0, per_user))) for v in values]
        expected = sum((1 - keep(l0, n)) * max(0.0, v) for n, v in zip(users, values, strict=True))
        loss = adaptive_bounds._selection_loss(model, l0, values, per_user)
        assert loss == pytest.approx(expected, rel=1e-12)
    # by hand for L0 = 2, 3 events per user: users 0, 0, 0, 2, 3, 13
    assert adaptive_bounds._selection_loss(model, 2, values, 3.0) == pytest.approx(
        1.0 + 6 * 0.75 + 9 * 0.625
    )
