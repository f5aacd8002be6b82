"""The ``/metrics`` text of a registry, rendered cheaply.

prometheus_client's :func:`~prometheus_client.generate_latest` builds, on every scrape, a
:class:`~prometheus_client.metrics_core.Metric` per family and a ``Sample`` (with a fresh
label dict) per series — twice for counters and histograms, whose ``*_created`` samples we
then drop — and formats each label set again. A worker is polled every few seconds (every
50 ms by bench/realistic.py) on its event loop, so that work is taken from the events.

:class:`Exposition` prints the same text (``*_created`` left out, as
:func:`~stream_dp.ops.metrics.registry_exposition` does) but keeps what cannot change
between scrapes: the ``# HELP``/``# TYPE`` lines of each family and, per series, the text
before its value (name and labels). Both are produced by ``generate_latest`` itself, once,
so escaping and label order are its own. Every scrape still reads every value, and every
series present at that moment, under the same locks prometheus_client takes: only text
is cached, never a value or the list of series.

Counters, gauges and histograms (prometheus_client's own classes) are read from their
children directly; anything else (``Info``, the process collector, a gauge with
``set_function``, a metric type of a newer prometheus_client) goes through its public
``collect()``, with the same per-series text cache. ``tests/ops/test_exposition.py``
compares the two renderings, so a change of prometheus_client's internals shows there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

#: prometheus_client's float formatting (Go's), the one ``generate_latest`` prints values with.
_go_float = cast("Callable[[float], str]", floatToGoString)
#: Families whose ``<name>_created`` sample is left out (see ``registry_exposition``).
_WITH_CREATED = frozenset({"counter", "histogram", "summary"})
#: Types whose samples ``generate_latest`` prints in place, in order (no OpenMetrics-only
#: samples moved to a family of their own).
_IN_PLACE = frozenset({"counter", "gauge", "histogram", "summary", "info", "unknown"})
#: Text cached per series beyond this many entries is dropped and rebuilt (series come and
#: go with partitions; this keeps a long-lived worker's cache bounded).
MAX_CACHED_SERIES = 10_000


class _Only:
    """A collector of given families, for ``generate_latest``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


def _empty(name: str, documentation: str, typ: str, unit: str) -> Metric:
    return Metric(name, documentation, typ, unit)


def _header(name: str, documentation: str, typ: str, unit: str) -> str:
    """``# HELP`` and ``# TYPE`` of a family, as ``generate_latest`` prints them."""
    return generate_latest(_Only([_empty(name, documentation, typ, unit)])).decode("utf-8")


def _prefix(family: Metric, sample_name: str, labels: dict[str, str]) -> str:
    """A series' line up to its value (``name{labels} ``), as ``generate_latest`` prints it."""
    copy = _empty(family.name, family.documentation, family.type, family.unit)
    copy.samples = [Sample(sample_name, labels, 0.0)]
    text = generate_latest(_Only([copy])).decode("utf-8")
    line = text.splitlines(keepends=True)[-1]
    return line[: -len("0.0\n")]


class _Plan:
    """The cached text of one metric of ours: its header and each child's line prefixes."""

    __slots__ = ("family", "header", "prefixes")

    def __init__(self, family: Metric) -> None:
        self.family = family
        self.header = _header(family.name, family.documentation, family.type, family.unit)
        self.prefixes: dict[tuple[str, ...], tuple[str, ...]] = {}


class Exposition:
    """A registry in the Prometheus text format 0.0.4, without ``*_created`` series: the
    bytes ``registry_exposition`` returns for the same registry state, at less CPU."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._plans: dict[Collector, _Plan] = {}
        self._headers: dict[tuple[str, str, str, str], str] = {}
        self._series: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}

    def render(self) -> bytes:
        """Every metric's current values (read now) in the text format."""
        out: list[str] = []
        target_info, collectors = self._collectors()
        if target_info is not None:
            self._render_collected(_Only([target_info]), out)
        for collector in collectors:
            if not self._render_own(collector, out):
                self._render_collected(collector, out)
        return "".join(out).encode("utf-8")

    def _collectors(self) -> tuple[Metric | None, list[Collector]]:
        """The registry's ``target_info`` family (if it has one) and its collectors, in
        the order ``CollectorRegistry.collect`` takes them."""
        registry: Any = self._registry
        with registry._lock:
            collectors = list(registry._collector_to_names)
            target_info = registry._target_info_metric() if registry._target_info else None
        if len(self._plans) > len(collectors):  # a collector was unregistered
            self._plans = {c: p for c, p in self._plans.items() if c in collectors}
        return target_info, collectors

    # -- counters, gauges, histograms: values read from the children --------------------------

    def _render_own(self, collector: Collector, out: list[str]) -> bool:
        """Render a Counter, Gauge or Histogram from its children; False for anything else
        (or a gauge with ``set_function``, whose value is a call)."""
        kind = type(collector)
        if kind is not Counter and kind is not Gauge and kind is not Histogram:
            return False
        metric: Any = collector
        children = _children(metric)
        if any("_child_samples" in vars(child) for _, child in children):
            return False
        plan = self._plans.get(collector)
        if plan is None:
            plan = self._plans[collector] = _Plan(metric._get_metric())
        prefixes = plan.prefixes
        if len(prefixes) > 2 * len(children) + 16:  # children were removed
            prefixes.clear()
        out.append(plan.header)
        fmt = _go_float
        for labelvalues, child in children:
            lines = prefixes.get(labelvalues)
            if lines is None:
                lines = prefixes[labelvalues] = _child_prefixes(
                    metric, plan.family, labelvalues, child
                )
            if kind is Histogram:
                acc = 0.0
                for prefix, bucket in zip(lines, child._buckets, strict=False):
                    acc += bucket.get()
                    out += (prefix, fmt(acc), "\n")
                count_prefix = lines[len(child._buckets)]
                out += (count_prefix, fmt(acc), "\n")
                if child._upper_bounds[0] >= 0:
                    out += (lines[-1], fmt(child._sum.get()), "\n")
            else:
                out += (lines[0], fmt(child._value.get()), "\n")
        return True

    # -- anything else: its public collect() ---------------------------------------------------

    def _render_collected(self, collector: Collector, out: list[str]) -> None:
        for family in collector.collect():
            created = f"{family.name}_created" if family.type in _WITH_CREATED else None
            samples = [s for s in family.samples if s.name != created]
            if family.type not in _IN_PLACE or any(s.timestamp is not None for s in samples):
                copy = _empty(family.name, family.documentation, family.type, family.unit)
                copy.samples = samples
                out.append(generate_latest(_Only([copy])).decode("utf-8"))
                continue
            key = (family.name, family.documentation, family.type, family.unit)
            header = self._headers.get(key)
            if header is None:
                header = self._headers[key] = _header(*key)
            out.append(header)
            series = self._series
            if len(series) > MAX_CACHED_SERIES:
                series.clear()
            for s in samples:
                skey = (family.name, s.name, tuple(s.labels.items()))
                prefix = series.get(skey)
                if prefix is None:
                    prefix = series[skey] = _prefix(family, s.name, s.labels)
                out += (prefix, _go_float(s.value), "\n")


def _children(metric: Any) -> list[tuple[tuple[str, ...], Any]]:
    """A metric's children now, in the order ``collect()`` yields them (the metric itself
    when it has no labels)."""
    if not metric._labelnames:
        return [((), metric)]
    with metric._lock:
        return list(metric._metrics.items())


def _child_prefixes(
    metric: Any, family: Metric, labelvalues: tuple[str, ...], child: Any
) -> tuple[str, ...]:
    """The line prefixes of one child, in ``_child_samples`` order: one for a counter or a
    gauge; each bucket, ``_count`` then ``_sum`` for a histogram."""
    labels = dict(zip(metric._labelnames, labelvalues, strict=True))
    name = metric._name
    if family.type == "counter":
        return (_prefix(family, f"{name}_total", labels),)
    if family.type == "gauge":
        return (_prefix(family, name, labels),)
    buckets = [
        _prefix(family, f"{name}_bucket", {**labels, "le": _go_float(bound)})
        for bound in child._upper_bounds
    ]
    count = _prefix(family, f"{name}_count", labels)
    total = _prefix(family, f"{name}_sum", labels)
    return (*buckets, count, total)
