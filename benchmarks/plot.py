"""Latency against offered load, drawn into a PNG: the figure the benchmarks' ``--plot``
writes beside their JSON.

:func:`plot_latency`: for each series (a name and its sweep of points),
p99 as a solid line and p50 as a dashed one of the same colour, latency on a log scale
(milliseconds) against offered load (operations per second).  A point is any mapping
with ``offered_per_s``, ``p50_us`` and ``p99_us``: the rows the benchmarks' open-loop
sweeps put in their JSON.  :func:`plot_curves`: figures against a size (e.g. a ratio to
the smallest size, against the number of ledgers), one line per figure.

matplotlib is optional (``pip install -e '.[bench]'``; ``make bench`` installs it): a
benchmark given ``--plot`` calls :func:`check_plotting` before it measures anything, so
a missing matplotlib is one clear line at the start, not a traceback at the end.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

#: A point of a sweep: ``offered_per_s``, ``p50_us``, ``p99_us`` (other keys ignored).
Point = Mapping[str, float]

#: The figure's size in inches and its resolution: about 900 x 540 pixels, a few
#: tens of KiB, small enough to keep in the repository.
FIGURE_INCHES = (7.5, 4.5)
DPI = 120


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed."""


def check_plotting(option: str = "--plot") -> None:
    """Raise PlottingUnavailable, saying how to install it, if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401  # only whether it is there
    except ImportError:
        raise PlottingUnavailable(
            f"{option} needs matplotlib, which is not installed: pip install -e '.[bench]' "
            "(make bench installs it)") from None


def plot_latency(path: str, series: Mapping[str, Sequence[Point]], title: str,
                 load_label: str = "offered load (operations/s)",
                 references_us: Mapping[str, float] | None = None) -> str:
    """Draw p50 and p99 latency (log scale) against offered load for each of ``series``
    (name -> points, in any order) into the PNG ``path``; return ``path``.
    ``references_us`` (name -> latency in µs, e.g. the same run's raw fdatasync p50) are
    drawn as dotted horizontal lines.

    A series whose points span more than a factor of 20 in offered load gets a log load
    axis too (all of them then share it)."""
    check_plotting()
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    loads = [p["offered_per_s"] for points in series.values() for p in points]
    if not loads:
        raise ValueError("nothing to plot: every series is empty")
    figure, axes = plt.subplots(figsize=FIGURE_INCHES, dpi=DPI)
    try:
        for number, (name, points) in enumerate(series.items()):
            ordered = sorted(points, key=lambda p: p["offered_per_s"])
            x = [p["offered_per_s"] for p in ordered]
            colour = f"C{number}"
            axes.plot(x, [p["p99_us"] / 1000 for p in ordered], "o-", color=colour,
                      label=f"{name} p99")
            axes.plot(x, [p["p50_us"] / 1000 for p in ordered], "s--", color=colour,
                      label=f"{name} p50")
        for name, latency_us in (references_us or {}).items():
            axes.axhline(latency_us / 1000, color="grey", linestyle=":", label=name)
        axes.set_yscale("log")
        if max(loads) > 20 * min(loads) > 0:
            axes.set_xscale("log")
        axes.set_xlabel(load_label)
        axes.set_ylabel("latency (ms, log scale)")
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
    return path


def plot_curves(path: str, x: Sequence[float], curves: Mapping[str, Sequence[float]],
                title: str, x_label: str, y_label: str) -> str:
    """Draw each of ``curves`` (name -> one value per ``x``) against ``x`` (log scale when
    it spans more than a factor of 20) into the PNG ``path``; return ``path``."""
    check_plotting()
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    if not x:
        raise ValueError("nothing to plot: no x values")
    figure, axes = plt.subplots(figsize=FIGURE_INCHES, dpi=DPI)
    try:
        for number, (name, values) in enumerate(curves.items()):
            axes.plot(x, values, "o-", color=f"C{number}", label=name)
        if max(x) > 20 * min(x) > 0:
            axes.set_xscale("log")
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        figure.savefig(path, format="png")
    finally:
        plt.close(figure)
    return path
