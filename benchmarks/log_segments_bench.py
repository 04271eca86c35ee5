#!/usr/bin/env python3
"""Benchmark: what a log's roll, open and reader's segment entry cost at 100 segments
and at 1,000,000.

Usage::

    python benchmarks/log_segments_bench.py [--quick] [--dir DIR]

For each size, a log of that many segments is built cheaply: a writer makes it, then
its segment records (and closed empty ledgers for the segments the reader walks) are
written straight into the closed embedded metadata store in one transaction
(``tests/segmentutil.py``).  Then, on one in-process bookie and that store:

* ``enter_us``: a reader starting ``window`` segments before the end reads up to the
  first record, entering each empty segment below the head's tail on the way (the head,
  the segment's record and its ledger's metadata read); the median over ``passes`` of
  the time per segment entered;
* ``roll_ms``: appends to a writer whose segments hold one batch, so that every append
  waits for a roll (a new ledger, the head's compare-and-set, the segment's record, the
  previous ledger closed); median and p90 per append;
* ``open_ms``: writers opening the log one after the other (each fences and recovers
  the last two segments, drops the previous writer's empty one and adds its own);
  median and p90.

Each also gives ``store_calls_each``, the metadata store calls (reads and writes of
records) per segment entered, per roll or per open, counted in the same run.  ``ratios``
divides each time at the large size by the one at 100 segments: 1 means the cost does
not depend on the number of segments.  ``--quick`` uses 100,000 segments
instead of 1,000,000.  Progress goes to stderr; stdout gets one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from rawdisk import ratio, run_and_report  # noqa: E402
from segmentutil import forge_segments  # noqa: E402

from pybk.client import BookKeeper  # noqa: E402
from pybk.client.transport import InProcessBookieClient  # noqa: E402
from pybk.errors import BookKeeperError  # noqa: E402
from pybk.log import LogReader, LogWriter, Position  # noqa: E402
from pybk.log.metadata import find_segment, log_path, read_log  # noqa: E402
from pybk.meta.embedded import EmbeddedMetadataStore  # noqa: E402
from pybk.settings import ClientSettings, LogSettings, ServerSettings  # noqa: E402
from pybk.storage import Bookie, format_bookie  # noqa: E402

LOG = "log"
BOOKIE = "bookie-1"
ONE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)


@dataclass(frozen=True)
class Profile:
    sizes: tuple[int, ...]
    window: int      # segments the reader enters
    passes: int      # times it does
    rolls: int
    opens: int


FULL = Profile(sizes=(100, 1_000_000), window=60, passes=9, rolls=60, opens=30)
QUICK = Profile(sizes=(100, 100_000), window=60, passes=5, rolls=40, opens=20)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class CountingStore:
    """Passes every call to a metadata store, counting the record reads and writes."""

    COUNTED = ("get", "exists", "children", "create", "set", "delete")

    def __init__(self, store: EmbeddedMetadataStore) -> None:
        self._store = store
        self.calls = 0

    def __getattr__(self, name: str):
        attribute = getattr(self._store, name)
        if name not in self.COUNTED:
            return attribute

        def counted(*args, **kwargs):
            self.calls += 1
            return attribute(*args, **kwargs)

        return counted


@contextlib.contextmanager
def client(workdir: str):
    """A BookKeeper client on one in-process bookie and the embedded store in
    ``workdir`` (both created on first use), through a :class:`CountingStore`."""
    settings = ServerSettings(journalDirectory=os.path.join(workdir, "journal"),
                              ledgerDirectories=(os.path.join(workdir, "ledgers"),))
    if not os.path.isdir(os.path.join(workdir, "journal")):
        format_bookie(settings)
    with Bookie(settings) as bookie, \
            EmbeddedMetadataStore(os.path.join(workdir, "metadata")) as store, \
            BookKeeper(CountingStore(store), {BOOKIE: InProcessBookieClient(BOOKIE, bookie)},
                       ClientSettings(), local_bookie=BOOKIE) as bk:
        yield bk


def summary_ms(samples_s: list[float], calls: int) -> dict:
    """Median and p90 of the samples; ``calls``: metadata store calls in all of them."""
    ordered = sorted(samples_s)
    return {"median_ms": round(statistics.median(ordered) * 1000, 3),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 3),
            "samples": len(ordered), "store_calls_each": round(calls / len(ordered), 2)}


def measure(workdir: str, size: int, profile: Profile) -> dict:
    with client(workdir) as bk:
        LogWriter.open(bk, LOG, ONE_COPY).close()  # segment 0
    started = time.monotonic()
    window_start = size - profile.window
    forge_segments(os.path.join(workdir, "metadata"), LOG, size - 1, BOOKIE,
                   with_ledgers=range(window_start, size))
    built_s = time.monotonic() - started
    say(f"{size} segments: built in {built_s:.1f} s")
    result: dict = {"segments": size, "build_seconds": round(built_s, 1)}
    with client(workdir) as bk:
        result["head_bytes"] = len(bk.metadata.get(log_path(LOG))[0])
        # A reader entering the empty segments of the window, below the tail.
        with LogWriter.open(bk, LOG, ONE_COPY) as writer:
            first = writer.append(b"first")
            head = read_log(bk.metadata, LOG).metadata
            entered = 0
            number = window_start
            while (segment := find_segment(bk.metadata, head, number)) is not None \
                    and segment.number <= first.segment:
                entered += 1
                number = segment.number + 1
            samples = []
            calls = bk.metadata.calls
            for _ in range(profile.passes):
                reader = LogReader(bk, LOG, Position(window_start, 0, 0), writer=writer)
                started = time.monotonic()
                record = next(iter(reader.read()))
                samples.append((time.monotonic() - started) / entered)
                assert record == (first, b"first"), record
            calls = bk.metadata.calls - calls
        result["enter_us"] = {"per_segment_us": round(statistics.median(samples) * 1e6, 1),
                              "segments_entered": entered, "passes": profile.passes,
                              "store_calls_each": round(calls / entered / profile.passes, 2)}
        say(f"{size} segments: {result['enter_us']}")
        # Rolls: every append waits for the roll the previous one made due.
        samples = []
        with LogWriter.open(bk, LOG, replace(ONE_COPY, segmentMaxBytes=1)) as writer:
            writer.append(b"fills the first segment")
            calls = bk.metadata.calls
            for i in range(profile.rolls):
                started = time.monotonic()
                writer.append(b"roll %d" % i)
                samples.append(time.monotonic() - started)
            calls = bk.metadata.calls - calls
        result["roll_ms"] = summary_ms(samples, calls)
        say(f"{size} segments: rolls {result['roll_ms']}")
        # Opens, one after the other.
        samples = []
        previous = None
        calls = 0
        for _ in range(profile.opens):
            before = bk.metadata.calls
            started = time.monotonic()
            writer = LogWriter.open(bk, LOG, ONE_COPY)
            samples.append(time.monotonic() - started)
            calls += bk.metadata.calls - before
            if previous is not None:
                with contextlib.suppress(BookKeeperError):  # fenced: its close may fail
                    previous.close()
            previous = writer
        previous.close()
        result["open_ms"] = summary_ms(samples, calls)
        say(f"{size} segments: opens {result['open_ms']}")
        result["head_bytes_after"] = len(bk.metadata.get(log_path(LOG))[0])
    return result


def run(workdir: str, profile: Profile) -> dict:
    by_size = {}
    for size in profile.sizes:
        directory = os.path.join(workdir, f"log-{size}")
        os.makedirs(directory)
        by_size[size] = measure(directory, size, profile)
    small, large = (by_size[s] for s in profile.sizes)
    return {
        "sizes": {str(s): by_size[s] for s in profile.sizes},
        "ratios": {
            "enter": ratio(large["enter_us"]["per_segment_us"],
                           small["enter_us"]["per_segment_us"]),
            "roll": ratio(large["roll_ms"]["median_ms"], small["roll_ms"]["median_ms"]),
            "open": ratio(large["open_ms"]["median_ms"], small["open_ms"]["median_ms"]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="100,000 segments at most (a minute or so)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where to make the temporary work directory")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    return run_and_report("pybk-log-segments-bench-", args.dir,
                          lambda workdir: run(workdir, profile))


if __name__ == "__main__":
    sys.exit(main())
