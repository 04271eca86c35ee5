#!/usr/bin/env python3
"""Benchmark of a bookie holding many ledgers: what changes when the same adds are spread
over 1, 10,000, 100,000 (and, with ``--full``, 1,000,000) ledgers.

Usage::

    python benchmarks/ledgers_bench.py [--full] [--quick] [--dir DIR]

For each ledger count N, one in-process bookie takes 200,000 adds of 1 KiB round-robin
over N ledgers (entry i goes to ledger ``i % N + 1``), 4,000 in flight, with the default
settings (a checkpoint every second).  Measured:

* ``adds_per_s``: the adds' rate (entries are built outside the timed part), and
  ``cpu_us_per_add``: the CPU time of all the process's threads (adds, journal,
  checkpoints) over the adds, entries' building included (the same at every N), which
  other work on a shared machine does not inflate as it does the rate.  These adds start
  from an empty bookie, so with N ledgers, N of them (half of them at N=100,000) each
  make a ledger: its master key record, its state;
* ``existing_ledgers``: the same two figures for a second round of as many round-robin
  adds over the ledgers the first round made, each ledger's entry ids going on from its
  last (taken after every other figure): the adds of a bookie that holds N ledgers
  (at most as many as the first round made, which at N=1,000,000 is 200,000);
* ``checkpoints``: how many ran during the adds and their mean duration, then the
  duration of the final checkpoint (``final_checkpoint_s``);
* ``index_bytes_per_entry``: LMDB's used pages over the entries held;
* ``memory_growth_mb``: resident memory after the adds and a checkpoint, minus before the
  bookie opened (the write cache is empty by then: what stays is per-ledger state, and
  LMDB's mapped pages, resident as the index is written: ``index_mb``), with
  ``ledger_states_in_memory``;
* ``restart``: a child process makes the same adds with no checkpoint, is SIGKILLed once
  they are durable, and the bookie is reopened: replay MiB/s and seconds to open, with
  the CPU seconds of the open (on a shared machine, wall time also counts other work).

Ratios to N=1 of the same run come with each N.  Progress goes to stderr; stdout gets one
JSON line.  ``--plot PNG`` draws the ratios to N=1 against N (matplotlib).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from plot import PlottingUnavailable, check_plotting  # noqa: E402
from rawdisk import MIB, mb_per_s, ratio, run_and_report  # noqa: E402
from storage_bench import (  # noqa: E402
    KEY,
    SMALL_ENTRY,
    InFlight,
    bookie_settings,
    entry_body,
    new_bookie_dir,
    replay_writer_settings,
    run_until_durable_then_kill,
    say_durable_then_wait_for_kill,
)

from pybk.storage.bookie import Bookie, format_bookie  # noqa: E402
from pybk.storage.entries import make_entry  # noqa: E402

ADDS = 200_000
WINDOW = 4_000
CHUNK = 50_000               # entries built at a time (bounds the benchmark's own memory)
LEDGER_COUNTS = (1, 10_000, 100_000)
FULL_LEDGER_COUNTS = (*LEDGER_COUNTS, 1_000_000)
QUICK_ADDS = 50_000
TARGET_ADD_RATIO = 0.8
TARGET_REPLAY_MB_S = 400


def say(message: str) -> None:
    print(f"[ledgers_bench] {message}", file=sys.stderr, flush=True)


def rss_mb() -> float:
    """Resident memory of this process now, in MiB, after a garbage collection and after
    glibc gave freed memory back (else the write cache's freed buffers would count)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the figure then includes memory the allocator kept
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def chunk_entries(ledgers: int, first: int, count: int, body: bytes, made: int = 0
                  ) -> list[tuple[int, int, bytes]]:
    """Adds ``first`` .. ``first + count - 1`` of the round-robin: (ledger, entry id,
    entry).  With ``made``, the adds of a round-robin that follows one of ``made`` adds:
    each ledger's entry ids go on from the entries that round gave it."""
    adds = []
    for i in range(first, first + count):
        ledger_id, entry_id = i % ledgers + 1, i // ledgers
        if made:
            entry_id += (made - ledger_id) // ledgers + 1
        adds.append((ledger_id, entry_id, make_entry(ledger_id, entry_id, entry_id - 1, body)))
    return adds


def round_robin(bookie: Bookie, ledgers: int, adds: int, made: int = 0) -> float:
    """Make ``adds`` round-robin adds (after a round of ``made``: see
    :func:`chunk_entries`), ``WINDOW`` in flight; the seconds spent adding (building the
    entries excluded)."""
    body = entry_body(SMALL_ENTRY)
    flight = InFlight()
    add = bookie.add_entry_async
    done = flight.on_complete
    resume_at = WINDOW // 2
    elapsed = 0.0
    for first in range(0, adds, CHUNK):
        batch = chunk_entries(ledgers, first, min(CHUNK, adds - first), body, made)
        started = time.perf_counter()
        for ledger_id, entry_id, entry in batch:
            if flight.submitted - flight.completed >= WINDOW:
                flight.wait_until(resume_at)
            flight.submitted += 1
            add(ledger_id, entry_id, entry, KEY, callback=done)
        flight.wait_until(0)
        elapsed += time.perf_counter() - started
        del batch
    flight.raise_errors()
    return elapsed


def measure_adds(workdir: str, ledgers: int, adds: int) -> dict:
    """Adds, checkpoints, index size and memory of one bookie over ``ledgers`` ledgers."""
    settings = bookie_settings(new_bookie_dir(workdir, f"adds-{ledgers}"))
    format_bookie(settings)
    before = rss_mb()
    with Bookie(settings) as bookie:
        cpu_started = time.process_time()
        seconds = round_robin(bookie, ledgers, adds)
        cpu_seconds = time.process_time() - cpu_started
        flush = bookie.stats.flush
        count, total_ms = flush.count, flush.sum
        started = time.perf_counter()
        bookie.checkpoint()
        final = time.perf_counter() - started
        growth = rss_mb() - before
        states = bookie.ledger_states_in_memory
        gauges = bookie.gauges()
        assert gauges is not None
        index_bytes = gauges.index_bytes
        cpu_started = time.process_time()
        existing_seconds = round_robin(bookie, ledgers, adds, made=adds)
        existing_cpu_seconds = time.process_time() - cpu_started
    existing = {"adds_per_s": round(adds / existing_seconds, 1),
                "cpu_us_per_add": round(existing_cpu_seconds / adds * 1e6, 2)}
    figures = {"adds": adds, "seconds": round(seconds, 3),
               "adds_per_s": round(adds / seconds, 1),
               "cpu_us_per_add": round(cpu_seconds / adds * 1e6, 2),
               "checkpoints": count,
               "checkpoint_mean_s": round(total_ms / count / 1000, 3) if count else None,
               "final_checkpoint_s": round(final, 3),
               "index_bytes_per_entry": round(index_bytes / adds, 1),
               "memory_growth_mb": round(growth, 1),
               "index_mb": round(index_bytes / MIB, 1),
               "ledger_states_in_memory": states, "existing_ledgers": existing}
    say(f"N={ledgers}: {figures['adds_per_s']:.0f} adds/s ({figures['cpu_us_per_add']} us "
        f"of CPU each), {count} checkpoints of "
        f"{figures['checkpoint_mean_s']} s, final {figures['final_checkpoint_s']} s, "
        f"index {figures['index_bytes_per_entry']} B/entry, +{figures['memory_growth_mb']} MiB; "
        f"then to those ledgers {existing['adds_per_s']:.0f} adds/s "
        f"({existing['cpu_us_per_add']} us of CPU each)")
    return figures


# -- restart after a crash --------------------------------------------------------------

def run_writer(bookie_dir: str, ledgers: int, adds: int) -> None:
    """Child process: make the adds durably, say so, then wait to be SIGKILLed."""
    bookie = Bookie(replay_writer_settings(bookie_dir, adds))
    round_robin(bookie, ledgers, adds)
    say_durable_then_wait_for_kill(adds)


def measure_restart(workdir: str, ledgers: int, adds: int) -> dict:
    """Replay speed and open time of a bookie SIGKILLed after ``adds`` adds."""
    bookie_dir = new_bookie_dir(workdir, f"restart-{ledgers}")
    format_bookie(bookie_settings(bookie_dir))
    run_until_durable_then_kill([sys.executable, os.path.abspath(__file__), "--writer",
                                 bookie_dir, "--ledgers", str(ledgers), "--adds", str(adds)],
                                adds)
    started, cpu_started = time.perf_counter(), time.process_time()
    bookie = Bookie(bookie_settings(bookie_dir))
    open_seconds = time.perf_counter() - started
    open_cpu = time.process_time() - cpu_started
    with bookie:
        stats = dict(bookie.replay_stats)
        last = adds - 1
        body = entry_body(SMALL_ENTRY)
        ledger_id, entry_id = last % ledgers + 1, last // ledgers
        if bookie.read_entry(ledger_id, entry_id) != make_entry(ledger_id, entry_id,
                                                                 entry_id - 1, body):
            raise RuntimeError("the last add did not survive the crash")
    figures = {"journal_mb": round(stats["bytes"] / MIB, 1),
               "replay_s": round(stats["seconds"], 3),
               "replay_mb_per_s": mb_per_s(int(stats["bytes"]), stats["seconds"]),
               "open_s": round(open_seconds, 3),
               "open_cpu_s": round(open_cpu, 3),
               "journal_mb_per_open_cpu_s": mb_per_s(int(stats["bytes"]), open_cpu)}
    say(f"N={ledgers}: restart replayed {figures['journal_mb']} MiB at "
        f"{figures['replay_mb_per_s']} MiB/s, Bookie() took {figures['open_s']} s "
        f"({figures['open_cpu_s']} s of CPU)")
    return figures


# -- report -----------------------------------------------------------------------------

def with_ratios(runs: dict[int, dict]) -> None:
    """Add each N's ratios to N=1 of the same run."""
    base = runs[1]
    for figures in runs.values():
        figures["ratio_to_1"] = {
            "adds_per_s": ratio(figures["adds_per_s"], base["adds_per_s"]),
            "cpu_us_per_add": ratio(figures["cpu_us_per_add"], base["cpu_us_per_add"]),
            "existing_adds_per_s": ratio(figures["existing_ledgers"]["adds_per_s"],
                                         base["existing_ledgers"]["adds_per_s"]),
            "existing_cpu_us_per_add": ratio(figures["existing_ledgers"]["cpu_us_per_add"],
                                             base["existing_ledgers"]["cpu_us_per_add"]),
            "checkpoint_mean_s": ratio(figures["checkpoint_mean_s"] or 0,
                                       base["checkpoint_mean_s"] or 0),
            "final_checkpoint_s": ratio(figures["final_checkpoint_s"],
                                        base["final_checkpoint_s"]),
            "restart_open_s": ratio(figures["restart"]["open_s"], base["restart"]["open_s"])}


def evaluate_targets(runs: dict[int, dict]) -> dict:
    """The issue's targets at the largest N measured (and replay speed at every N): the
    add rate of a bookie holding N ledgers (``existing_ledgers``), and, reported the same
    way, that of the first round, which makes them."""
    largest = runs[max(runs)]["ratio_to_1"]
    add_ratio = largest["existing_adds_per_s"]
    making_ratio = largest["adds_per_s"]
    slowest_replay = min(f["restart"]["replay_mb_per_s"] for f in runs.values())
    targets: dict = {
        "add_rate_ratio": {"value": add_ratio, "target": f">= {TARGET_ADD_RATIO} at "
                           f"N={max(runs)}", "pass": add_ratio >= TARGET_ADD_RATIO},
        "add_rate_ratio_making_the_ledgers": {
            "value": making_ratio, "target": f">= {TARGET_ADD_RATIO} at N={max(runs)}",
            "pass": making_ratio >= TARGET_ADD_RATIO},
        "replay_mb_per_s": {"value": slowest_replay, "target": f">= {TARGET_REPLAY_MB_S}",
                            "pass": slowest_replay >= TARGET_REPLAY_MB_S},
    }
    targets["all_pass"] = all(t["pass"] for t in targets.values())
    return targets


def run(workdir: str, counts: tuple[int, ...], adds: int, plot: str | None) -> dict:
    started = time.perf_counter()
    load = os.getloadavg()
    runs: dict[int, dict] = {}
    for ledgers in counts:
        runs[ledgers] = measure_adds(workdir, ledgers, adds)
        runs[ledgers]["restart"] = measure_restart(workdir, ledgers, adds)
    with_ratios(runs)
    result = {"adds": adds, "window": WINDOW, "entry_bytes": SMALL_ENTRY,
              "loadavg_before": [round(x, 2) for x in load],
              "runs": {str(n): f for n, f in runs.items()},
              "targets": evaluate_targets(runs),
              "elapsed_s": round(time.perf_counter() - started, 1)}
    if plot:
        draw(runs, plot)
    return result


def draw(runs: dict[int, dict], path: str) -> None:
    """The ratios to N=1 against N, as a PNG (:func:`plot.plot_curves`)."""
    from plot import plot_curves
    counts = sorted(runs)
    plot_curves(path, counts, {
        "adds/s, making the ledgers": [runs[n]["ratio_to_1"]["adds_per_s"] for n in counts],
        "adds/s to ledgers that exist": [runs[n]["ratio_to_1"]["existing_adds_per_s"]
                                         for n in counts],
        "checkpoint time (mean)": [runs[n]["ratio_to_1"]["checkpoint_mean_s"] for n in counts],
        "restart (Bookie() open) time": [runs[n]["ratio_to_1"]["restart_open_s"]
                                         for n in counts],
    }, "one bookie, 200,000 adds of 1 KiB round-robin over N ledgers",
        "ledgers (N)", "ratio to N=1, same run")
    say(f"plot written to {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="also 1,000,000 ledgers")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_ADDS} adds per N instead of {ADDS}")
    parser.add_argument("--counts", help="ledger counts to measure, comma-separated "
                        "(default 1,10000,100000; 1 is always measured, for the ratios)")
    parser.add_argument("--plot", metavar="PNG",
                        help="also draw the ratios to N=1 against N into PNG (matplotlib)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where the fresh temporary directory is made")
    # Internal: the child process of the restart measurement.
    parser.add_argument("--writer", metavar="BOOKIE_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--ledgers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--adds", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.writer:
        run_writer(args.writer, args.ledgers, args.adds)
        return 0
    counts: tuple[int, ...] = FULL_LEDGER_COUNTS if args.full else LEDGER_COUNTS
    if args.counts:
        counts = tuple(sorted({1, *map(int, args.counts.split(","))}))
    adds = QUICK_ADDS if args.quick else ADDS
    if args.plot:
        try:
            check_plotting()
        except PlottingUnavailable as e:
            print(f"ledgers_bench: {e}", file=sys.stderr)
            return 2
    return run_and_report("pybk-ledgers-", args.dir,
                          lambda workdir: run(workdir, counts, adds, args.plot))


if __name__ == "__main__":
    sys.exit(main())
