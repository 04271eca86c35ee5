#!/usr/bin/env python3
"""Benchmark: listing 100,000 ledgers, page by page, on the embedded store and on
ZooKeeper (hierarchical and flat layouts).

Usage::

    python benchmarks/listing_bench.py [--quick] [--dir DIR] [--ledgers N]

For each store, ``N`` ledger records (default 100,000; 20,000 with ``--quick``) are
written in batches (``create_many``, :mod:`pybk.testing.ledger_records`), then listed:

* ``ids``: :meth:`~pybk.meta.ledgers.LedgerManager.iter_ledger_ids` to the end, timed
  (``ids_per_s``, the best of ``passes``) and, in a pass of its own, traced with
  ``tracemalloc``: ``peak_kb`` is the most Python memory the listing held at once;
* ``whole_list``: the same for :meth:`~pybk.meta.ledgers.LedgerManager.ledger_ids`, every
  id in one sorted list (what ``list_ledgers`` returns), for comparison;
* ``metadata``: :meth:`~pybk.meta.ledgers.LedgerManager.iter_ledgers` over the first
  ``metadata_ledgers`` ledgers (one read each), ``ledgers_per_s`` and ``peak_kb``.

The embedded store is in the work directory; ZooKeeper is a server of the benchmark's
own (``pybk.testing.zookeeper_server``, its data in the work directory, forceSync off: the
listing reads only).  Progress goes to stderr; stdout gets one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import tracemalloc
from typing import Callable, Iterable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rawdisk import run_and_report  # noqa: E402

from pybk.meta.embedded import EmbeddedMetadataStore  # noqa: E402
from pybk.meta.interface import MetadataStore  # noqa: E402
from pybk.meta.ledgers import LedgerManager  # noqa: E402
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster  # noqa: E402
from pybk.testing.ledger_records import put_ledgers  # noqa: E402
from pybk.testing.zookeeper_server import ZooKeeperServer  # noqa: E402

PASSES = 3
METADATA_LEDGERS = 2_000


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(listing: Callable[[], Iterable[object]]) -> tuple[int, float]:
    """How many items ``listing()`` gives, and the best time of PASSES runs in seconds."""
    best, count = float("inf"), 0
    for _ in range(PASSES):
        started = time.perf_counter()
        count = sum(1 for _ in listing())
        best = min(best, time.perf_counter() - started)
    return count, best


def peak_kb(listing: Callable[[], Iterable[object]]) -> float:
    """The most Python memory ``listing()`` holds at once while it is run to its end."""
    tracemalloc.start()
    try:
        for _ in listing():
            pass
        return round(tracemalloc.get_traced_memory()[1] / 1024, 1)
    finally:
        tracemalloc.stop()


def measure(store: MetadataStore, ledgers: int) -> dict:
    started = time.perf_counter()
    put_ledgers(store, range(ledgers))
    created_s = time.perf_counter() - started
    manager = LedgerManager(store)
    ids, ids_s = timed(manager.iter_ledger_ids)
    assert ids == ledgers, f"listed {ids} of {ledgers} ledgers"
    whole, whole_s = timed(manager.ledger_ids)
    assert whole == ledgers
    first: Callable[[], Iterable[object]] = lambda: itertools.islice(  # noqa: E731
        manager.iter_ledgers(), METADATA_LEDGERS)
    read, read_s = timed(first)
    return {
        "ledgers": ledgers,
        "create_per_s": round(ledgers / created_s),
        "ids": {"ids_per_s": round(ids / ids_s), "peak_kb": peak_kb(manager.iter_ledger_ids)},
        "whole_list": {"ids_per_s": round(whole / whole_s),
                       "peak_kb": peak_kb(manager.ledger_ids)},
        "metadata": {"ledgers": read, "ledgers_per_s": round(read / read_s),
                     "peak_kb": peak_kb(first)},
    }


def run(workdir: str, ledgers: int) -> dict:
    result = {}
    with EmbeddedMetadataStore(os.path.join(workdir, "embedded")) as embedded:
        result["embedded_flat"] = measure(embedded, ledgers)
    say(f"embedded: {result['embedded_flat']}")
    with ZooKeeperServer(os.path.join(workdir, "zookeeper"), force_sync=False,
                         heap_mb=512) as zookeeper:
        for layout in ("hierarchical", "flat"):
            address = zookeeper.address(f"/{layout}/ledgers")
            format_cluster(address, layout=layout)
            with ZooKeeperMetadataStore(address) as store:
                result[f"zookeeper_{layout}"] = measure(store, ledgers)
            say(f"zookeeper {layout}: {result[f'zookeeper_{layout}']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 ledgers")
    parser.add_argument("--ledgers", type=int, help="how many ledgers (default 100,000)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where to make the temporary work directory")
    args = parser.parse_args(argv)
    ledgers = args.ledgers or (20_000 if args.quick else 100_000)
    return run_and_report("pybk-listing-bench-", args.dir, lambda workdir: run(workdir,
                                                                               ledgers))


if __name__ == "__main__":
    sys.exit(main())
