""":mod:`pybk.stats` figures as Prometheus metric families, built when Prometheus scrapes.

Imported only where metrics are wanted (it imports prometheus_client): the bookie's
collector (:mod:`pybk.http.metrics`) and a client's (:mod:`pybk.client.metrics`).
Latency histograms carry BookKeeper's ``success`` label, as its OpStatsLogger reports
them (BookKeeper writes quantiles, pybk buckets: ``histogram_quantile`` gives the
quantiles).
"""

from __future__ import annotations

from prometheus_client.core import HistogramMetricFamily

from pybk.stats import Histogram, OpStats


def _buckets(histogram: Histogram) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets, +Inf last, and the sum."""
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip((*histogram.bounds, float("inf")), list(histogram.counts)):
        total += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return buckets, histogram.sum


def histogram_family(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    """A histogram without labels."""
    buckets, total = _buckets(histogram)
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def op_histogram_family(name: str, doc: str,
                        stats: OpStats | Histogram) -> HistogramMetricFamily:
    """A histogram with BookKeeper's ``success`` label (a plain histogram counts only
    successes)."""
    family = HistogramMetricFamily(name, doc, labels=["success"])
    parts = ((("true", stats.success), ("false", stats.failure))
             if isinstance(stats, OpStats) else (("true", stats),))
    for label, histogram in parts:
        buckets, total = _buckets(histogram)
        family.add_metric([label], buckets, total)
    return family
