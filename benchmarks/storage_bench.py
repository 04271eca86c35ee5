#!/usr/bin/env python3
"""Benchmark of pybk's bookie storage engine against the raw limits of the same disk.

Usage::

    python benchmarks/storage_bench.py [--quick] [--dir DIR]

Progress goes to stderr; stdout gets one line, a JSON object with every figure (so it is
also the last line of the combined output).  See ``benchmarks/README.md`` for what each
figure means.  Targets are reported with pass/fail booleans, never asserted: the exit
code is 0 unless the benchmark itself fails (e.g. an add is refused).
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rawdisk import MIB, RAW_VARIANTS, latency_summary, mb_per_s, measure_raw, ratio, run_and_report  # noqa: E402

from pybk.checksum import crc32c  # noqa: E402
from pybk.fileio import FileIO  # noqa: E402
from pybk.settings import ServerSettings  # noqa: E402
from pybk.storage import journal_codec as codec  # noqa: E402
from pybk.storage.bookie import Bookie, format_bookie  # noqa: E402
from pybk.storage.entries import ENTRY_HEADER_SIZE, make_entry  # noqa: E402

SMALL_ENTRY = 1024           # "1 KiB entries": total size, header included
LARGE_ENTRY = 64 * 1024      # "64 KiB entries"
KEY = b"storage-bench"
JOURNAL_SUFFIX = ".txn"
LEDGER_SMALL, LEDGER_LARGE, LEDGER_SINGLE, LEDGER_REPLAY = 1, 2, 3, 4
REPLAY_FLUSH_INTERVAL_MS = 3_600_000

TARGET_ENTRIES_PER_S = 100_000
TARGET_BANDWIDTH_RATIO = 0.7
TARGET_SINGLE_ADD_RATIO = 1.5
TARGET_PEAK_RSS_MB = 300


@dataclass(frozen=True)
class Profile:
    """How much work each measurement does."""

    name: str
    raw_seconds: float        # time budget of each raw fdatasync loop
    raw_max_ops: int          # cap of each raw loop (also sizes the preallocated files)
    bandwidth_mb: int         # MiB written by the raw bandwidth test
    window: int               # most adds in flight
    small_batch: int          # 1 KiB entries pre-built per round
    small_rounds: int
    large_batch: int          # 64 KiB entries pre-built per round
    large_rounds: int
    single_adds: int          # most blocking adds...
    single_seconds: float     # ...and their time budget
    random_reads: int
    replay_entries: int       # 1 KiB entries written by the crashed child


QUICK = Profile("quick", raw_seconds=1.5, raw_max_ops=16_384, bandwidth_mb=256, window=4000,
                small_batch=40_000, small_rounds=2, large_batch=256, large_rounds=8,
                single_adds=3000, single_seconds=2.0, random_reads=20_000,
                replay_entries=60_000)
FULL = Profile("full", raw_seconds=5.0, raw_max_ops=65_536, bandwidth_mb=1024, window=4000,
               small_batch=50_000, small_rounds=6, large_batch=512, large_rounds=8,
               single_adds=20_000, single_seconds=8.0, random_reads=100_000,
               replay_entries=200_000)


def say(message: str) -> None:
    """A progress line (stderr, so that stdout holds only the JSON result)."""
    print(f"[storage_bench] {message}", file=sys.stderr, flush=True)


# -- bookie helpers ---------------------------------------------------------------------

class JournalSyncCounter(FileIO):
    """FileIO that counts the fdatasync calls made on journal files (``*.txn``).

    Entry logs and lastMark sync through the same FileIO; they are not counted.
    """

    def __init__(self) -> None:
        self.journal_syncs = 0

    def fdatasync(self, fd: int) -> None:
        """Count the call if ``fd`` is a journal file, then sync."""
        if os.readlink(f"/proc/self/fd/{fd}").endswith(JOURNAL_SUFFIX):
            self.journal_syncs += 1
        super().fdatasync(fd)


class InFlight:
    """Bounds the adds in flight without a semaphore.

    The producer alone counts submissions and the completion callback (run by one
    journal-syncing thread at a time) alone counts completions; a lock released by the
    callback is the producer's wake-up signal.  Spurious wake-ups are harmless: the
    producer re-checks the counters.
    """

    def __init__(self) -> None:
        self.submitted = 0
        self.completed = 0
        self.errors: list[BaseException] = []
        self._resume_at = 0
        self._waiting = False
        self._wakeup = threading.Lock()
        self._wakeup.acquire()

    def on_complete(self, error: BaseException | None) -> None:
        """The add callback."""
        self.completed += 1
        if error is not None:
            self.errors.append(error)
        if self._waiting and self.submitted - self.completed <= self._resume_at:
            self._waiting = False
            try:
                self._wakeup.release()
            except RuntimeError:
                pass  # already released

    def wait_until(self, in_flight: int) -> None:
        """Block until at most ``in_flight`` adds are outstanding."""
        while self.submitted - self.completed > in_flight:
            self._resume_at = in_flight
            self._waiting = True
            # Re-check after announcing the wait: a completion may have come in between.
            if self.submitted - self.completed > in_flight:
                self._wakeup.acquire(timeout=0.05)
            self._waiting = False

    def raise_errors(self) -> None:
        """Fail the benchmark if an add failed (a refused add is not a slow add)."""
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} adds failed; first: {self.errors[0]!r}")


def entry_body(size: int) -> bytes:
    """A deterministic body making an entry of ``size`` bytes with its header."""
    pattern = bytes(range(256))
    length = size - ENTRY_HEADER_SIZE
    return (pattern * (length // 256 + 1))[:length]


def build_entries(ledger_id: int, first_id: int, count: int, size: int) -> list[bytes]:
    """``count`` entries of ``size`` bytes with consecutive ids (LAC = id - 1)."""
    body = entry_body(size)
    return [make_entry(ledger_id, entry_id, entry_id - 1, body)
            for entry_id in range(first_id, first_id + count)]


def pump(bookie: Bookie, ledger_id: int, first_id: int, entries: list[bytes], window: int,
         flight: InFlight) -> None:
    """Add ``entries`` asynchronously, at most ``window`` in flight; return when all are
    durable.  The producer sleeps from a full window until half of it completed."""
    add = bookie.add_entry_async
    done = flight.on_complete
    resume_at = window // 2
    for entry_id, entry in enumerate(entries, first_id):
        if flight.submitted - flight.completed >= window:
            flight.wait_until(resume_at)
        flight.submitted += 1
        add(ledger_id, entry_id, entry, KEY, callback=done)
    flight.wait_until(0)
    flight.raise_errors()


def bookie_settings(workdir: str, **overrides) -> ServerSettings:
    """Default settings, with the journal and one ledger directory under ``workdir``."""
    return ServerSettings(journalDirectory=os.path.join(workdir, "journal"),
                          ledgerDirectories=(os.path.join(workdir, "ledgers"),), **overrides)


def new_bookie_dir(workdir: str, name: str) -> str:
    """A fresh directory for one bookie."""
    path = os.path.join(workdir, name)
    os.makedirs(path)
    return path


# -- bookie measurements ----------------------------------------------------------------

def measure_pipelined(bookie: Bookie, io: JournalSyncCounter, ledger_id: int, size: int,
                      batch: int, rounds: int, window: int) -> dict:
    """Throughput of async adds of ``size``-byte entries, many in flight.

    Entries are pre-built one batch per round (bounding the benchmark's own memory);
    only the adding is timed.
    """
    flight = InFlight()
    elapsed = 0.0
    syncs = 0
    for round_number in range(rounds):
        first_id = round_number * batch
        entries = build_entries(ledger_id, first_id, batch, size)
        syncs_before = io.journal_syncs
        started = time.perf_counter()
        pump(bookie, ledger_id, first_id, entries, window, flight)
        elapsed += time.perf_counter() - started
        syncs += io.journal_syncs - syncs_before
        del entries
    count = batch * rounds
    return {"entries": count, "entry_bytes": size, "window": min(window, batch),
            "seconds": round(elapsed, 3), "entries_per_s": round(count / elapsed, 1),
            "mb_per_s": mb_per_s(count * size, elapsed), "journal_fdatasyncs": syncs,
            "entries_per_fdatasync": round(count / syncs, 1) if syncs else None}


def measure_single_adds(bookie: Bookie, ledger_id: int, profile: Profile) -> dict:
    """Latency of blocking adds of 1 KiB entries, one at a time from one thread."""
    entries = build_entries(ledger_id, 0, profile.single_adds, SMALL_ENTRY)
    samples: list[int] = []
    clock = time.perf_counter_ns
    started = clock()
    deadline = started + int(profile.single_seconds * 1e9)
    for entry_id, entry in enumerate(entries):
        begin = clock()
        bookie.add_entry(ledger_id, entry_id, entry, KEY)
        end = clock()
        samples.append(end - begin)
        if end >= deadline:
            break
    return latency_summary(samples, (clock() - started) / 1e9)


def verify_sample(bookie: Bookie, ledger_id: int, entry_ids: Iterable[int], size: int) -> None:
    """Check that a few entries read back exactly as they were added."""
    body = entry_body(size)
    for entry_id in entry_ids:
        if bookie.read_entry(ledger_id, entry_id) != make_entry(ledger_id, entry_id,
                                                                 entry_id - 1, body):
            raise RuntimeError(f"ledger {ledger_id} entry {entry_id} read back wrong")


def measure_reads(bookie: Bookie, ledger_id: int, count: int, size: int,
                  random_reads: int) -> dict:
    """Random and sequential reads of checkpointed entries (index, then entry log)."""
    bookie.checkpoint()
    rng = random.Random(42)
    verify_sample(bookie, ledger_id, rng.sample(range(count), min(100, count)), size)
    ids = [rng.randrange(count) for _ in range(random_reads)]
    read = bookie.read_entry
    started = time.perf_counter()
    for entry_id in ids:
        read(ledger_id, entry_id)
    random_elapsed = time.perf_counter() - started
    started = time.perf_counter()
    nbytes = sum(len(read(ledger_id, entry_id)) for entry_id in range(count))
    sequential_elapsed = time.perf_counter() - started
    return {"random_reads": random_reads,
            "random_reads_per_s": round(random_reads / random_elapsed, 1),
            "sequential_entries": count,
            "sequential_entries_per_s": round(count / sequential_elapsed, 1),
            "sequential_mb_per_s": mb_per_s(nbytes, sequential_elapsed)}


def measure_bookie(workdir: str, profile: Profile, raw: dict, rss: RssLog) -> dict:
    """Adds (1 KiB and 64 KiB pipelined, single blocking) and reads on a fresh bookie."""
    settings = bookie_settings(new_bookie_dir(workdir, "bookie"))
    format_bookie(settings)
    io = JournalSyncCounter()
    results: dict = {}
    with Bookie(settings, io=io) as bookie:
        results["add_1k"] = small = measure_pipelined(
            bookie, io, LEDGER_SMALL, SMALL_ENTRY, profile.small_batch, profile.small_rounds,
            profile.window)
        say(f"1 KiB adds: {small['entries_per_s']:.0f} entries/s, {small['mb_per_s']} MiB/s, "
            f"{small['entries_per_fdatasync']} entries per journal fdatasync")
        rss.mark("add_1k")
        results["add_64k"] = large = measure_pipelined(
            bookie, io, LEDGER_LARGE, LARGE_ENTRY, profile.large_batch, profile.large_rounds,
            profile.window)
        large["ratio_to_raw_bandwidth"] = ratio(large["mb_per_s"], raw["durable_write_mb_s"])
        say(f"64 KiB adds: {large['mb_per_s']} MiB/s ({large['ratio_to_raw_bandwidth']} of raw), "
            f"{large['entries_per_fdatasync']} entries per journal fdatasync")
        rss.mark("add_64k")
        results["single_add"] = single = measure_single_adds(bookie, LEDGER_SINGLE, profile)
        single["p50_ratio_to_raw"] = {variant: ratio(single["p50_us"],
                                                     raw[f"fdatasync_{variant}"]["p50_us"])
                                      for variant in RAW_VARIANTS}
        say(f"single adds: p50 {single['p50_us']} µs, p99 {single['p99_us']} µs, "
            f"p50/raw {single['p50_ratio_to_raw']}")
        rss.mark("single_add")
        results["reads"] = reads = measure_reads(
            bookie, LEDGER_SMALL, profile.small_batch * profile.small_rounds, SMALL_ENTRY,
            profile.random_reads)
        say(f"reads: {reads['random_reads_per_s']:.0f} random/s, "
            f"{reads['sequential_mb_per_s']} MiB/s sequential")
        rss.mark("reads")
    return results


# -- restart (journal replay) -----------------------------------------------------------

def replay_writer_settings(bookie_dir: str, entries: int) -> ServerSettings:
    """Settings under which writing ``entries`` 1 KiB entries never checkpoints."""
    data_mb = entries * SMALL_ENTRY // MIB + 1
    return bookie_settings(bookie_dir, flushInterval=REPLAY_FLUSH_INTERVAL_MS,
                           writeCacheMaxSizeMb=2 * data_mb + 64)


def run_replay_writer(bookie_dir: str, entries: int, window: int) -> None:
    """Child process: add ``entries`` durably, say so, then wait to be SIGKILLed."""
    settings = replay_writer_settings(bookie_dir, entries)
    bookie = Bookie(settings)
    pump(bookie, LEDGER_REPLAY, 0, build_entries(LEDGER_REPLAY, 0, entries, SMALL_ENTRY),
         window, InFlight())
    say_durable_then_wait_for_kill(entries)


def say_durable_then_wait_for_kill(entries: int) -> None:
    """A crash writer's end: tell the parent its ``entries`` adds are durable, then
    wait for SIGKILL (the bookie is never closed: the close-time checkpoint must not
    happen)."""
    print(f"durable {entries}", flush=True)
    while True:
        signal.pause()


def run_until_durable_then_kill(command: list[str], entries: int) -> None:
    """Start the crash writer ``command`` and SIGKILL it once it says its ``entries``
    adds are durable (:func:`say_durable_then_wait_for_kill`); raise if it says
    anything else first."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != f"durable {entries}":
            raise RuntimeError(f"the crash writer failed (said {line!r}, "
                               f"exit code {child.poll()})")
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def write_then_crash(bookie_dir: str, profile: Profile) -> None:
    """Run the writing phase in a child process and SIGKILL it once it is durable."""
    run_until_durable_then_kill(
        [sys.executable, os.path.abspath(__file__), "--replay-writer", bookie_dir,
         "--replay-entries", str(profile.replay_entries), "--window", str(profile.window)],
        profile.replay_entries)


def replay_floor(journal_dir: str, out_path: str, settings: ServerSettings) -> dict:
    """The least work a replay of the journal files in ``journal_dir`` must do, as a
    minimal program: read each file (mapped), verify each record's CRC-32C, and write the
    records' bytes to one entry-log-like file at ``out_path`` with the replay's cadence (a
    write-out every ``flushEntrylogBytes``, an fdatasync every half write cache and at the
    end).  No ledger states, no index, no entry log headers or ledger maps."""
    io = FileIO()
    flush_bytes = settings.flushEntrylogBytes
    sync_bytes = settings.writeCacheMaxSizeMb * MIB // 2
    unpack, header_size, seeds = codec.RECORD.unpack_from, codec.RECORD.size, codec.TYPE_SEEDS
    records = payload_bytes = written = synced = 0
    started, started_cpu = time.perf_counter(), time.process_time()
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for journal_id in codec.list_journal_ids(journal_dir):
            with open(os.path.join(journal_dir, codec.journal_file_name(journal_id)),
                      "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                with memoryview(data) as view:
                    pos = step = codec.HEADER_SIZE
                    while pos + header_size <= len(data):
                        length, crc, rtype = unpack(data, pos)
                        if not (length or crc or rtype):
                            break  # the preallocated zeros after the last record
                        end = pos + header_size + length
                        if crc32c(view[pos + header_size:end], seeds[rtype]) != crc:
                            raise RuntimeError(f"journal {journal_id}: bad record at {pos}")
                        records += 1
                        payload_bytes += length
                        pos = end
                        if pos - step >= flush_bytes:
                            written += write_paced(io, out, view[step:pos], written)
                            step = pos
                            if written - synced >= sync_bytes:
                                io.fdatasync(out)
                                synced = written
                                # Pages read are not needed again: as the replay's scan
                                # does, so the floor does not raise peak_rss_mb.
                                data.madvise(mmap.MADV_DONTNEED, 0, pos - pos % mmap.PAGESIZE)
                    written += write_paced(io, out, view[step:pos], written)
        io.fdatasync(out)
    finally:
        os.close(out)
        os.unlink(out_path)
    seconds = time.perf_counter() - started
    return {"records": records, "bytes": payload_bytes, "seconds": round(seconds, 3),
            "cpu_seconds": round(time.process_time() - started_cpu, 3),
            "mb_per_s": mb_per_s(payload_bytes, seconds)}


def write_paced(io: FileIO, fd: int, data: memoryview, offset: int) -> int:
    """Append ``data`` (at file offset ``offset``) and write it out to the disk, as the
    entry log does every ``flushEntrylogBytes``; returns its length."""
    io.write_all(fd, [data])
    if data:
        io.write_out(fd, offset, len(data))
    return len(data)


def measure_replay(workdir: str, profile: Profile) -> dict:
    """Journal replay speed of a restart after a crash (no checkpoint since the adds), and
    the floor of the same journal's replay (:func:`replay_floor`), measured just before."""
    bookie_dir = new_bookie_dir(workdir, "replay")
    format_bookie(bookie_settings(bookie_dir))
    write_then_crash(bookie_dir, profile)
    settings = bookie_settings(bookie_dir)  # the restart uses the default write cache
    floor = replay_floor(os.path.join(settings.journalDirectory, "current"),
                         os.path.join(settings.ledgerDirectories[0], "floor.log"), settings)
    say(f"journal replay floor: {floor['mb_per_s']} MiB/s, {floor['cpu_seconds']} s CPU")
    started, started_cpu = time.perf_counter(), time.process_time()
    bookie = Bookie(settings)
    open_seconds = time.perf_counter() - started
    open_cpu_seconds = time.process_time() - started_cpu
    with bookie:
        stats = dict(bookie.replay_stats)
        if stats["records"] < profile.replay_entries:
            raise RuntimeError(f"replayed {stats['records']} records, expected "
                               f"{profile.replay_entries} adds")
        verify_sample(bookie, LEDGER_REPLAY, (0, profile.replay_entries - 1), SMALL_ENTRY)
    figures = {"records": stats["records"], "bytes": stats["bytes"],
               "seconds": round(stats["seconds"], 3),
               "mb_per_s": mb_per_s(stats["bytes"], stats["seconds"]),
               "records_per_s": round(stats["records"] / stats["seconds"], 1),
               "open_seconds": round(open_seconds, 3),
               "open_cpu_seconds": round(open_cpu_seconds, 3),
               "replay_floor": floor}
    figures["replay_to_floor"] = ratio(figures["mb_per_s"], floor["mb_per_s"])
    figures["cpu_to_floor"] = ratio(figures["open_cpu_seconds"], floor["cpu_seconds"])
    say(f"journal replay: {figures['mb_per_s']} MiB/s, {figures['records_per_s']:.0f} "
        f"records/s, {figures['replay_to_floor']} of the floor's rate (Bookie() took "
        f"{figures['open_seconds']} s, {figures['open_cpu_seconds']} s CPU, "
        f"{figures['cpu_to_floor']} x the floor's)")
    return figures


# -- report -----------------------------------------------------------------------------

def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss is in KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def largest_prebuilt_batch_mb(profile: Profile) -> float:
    """MiB held by the benchmark's largest batch of pre-built entries (part of the peak)."""
    per_object = sys.getsizeof(b"")
    return round(max(profile.small_batch * (SMALL_ENTRY + per_object),
                     profile.large_batch * (LARGE_ENTRY + per_object)) / MIB, 1)


class RssLog:
    """The peak RSS of this process as each phase ends (it only grows: a jump names the
    phase that set the peak)."""

    def __init__(self) -> None:
        self.after: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """Record the peak so far as the figure of ``phase``."""
        self.after[phase] = peak_rss_mb()


def target(value: float, passed: bool, wanted: str) -> dict:
    """One target's entry in the report."""
    return {"value": value, "target": wanted, "pass": passed}


def evaluate_targets(bookie: dict, peak_mb: float) -> dict:
    """The issue's targets, each with its measured value and a pass/fail boolean."""
    per_s = bookie["add_1k"]["entries_per_s"]
    bandwidth = bookie["add_64k"]["ratio_to_raw_bandwidth"]
    single = bookie["single_add"]["p50_ratio_to_raw"]["append"]
    targets = {
        "durable_1k_entries_per_s": target(per_s, per_s >= TARGET_ENTRIES_PER_S,
                                           f">= {TARGET_ENTRIES_PER_S}"),
        "add_64k_bandwidth_ratio": target(bandwidth, bandwidth >= TARGET_BANDWIDTH_RATIO,
                                          f">= {TARGET_BANDWIDTH_RATIO} x raw durable bandwidth"),
        "single_add_p50_ratio": target(single, single <= TARGET_SINGLE_ADD_RATIO,
                                       f"<= {TARGET_SINGLE_ADD_RATIO} x raw fdatasync p50 "
                                       "(append)"),
        "peak_rss_mb": target(peak_mb, peak_mb < TARGET_PEAK_RSS_MB,
                              f"< {TARGET_PEAK_RSS_MB}"),
    }
    targets["all_pass"] = all(t["pass"] for t in targets.values())
    return targets


def run(profile: Profile, workdir: str) -> dict:
    """Every measurement, in order; returns the JSON-ready result."""
    started = time.perf_counter()
    say(f"{profile.name} run in {workdir}")
    rss = RssLog()
    raw = measure_raw(workdir, profile.raw_seconds, profile.raw_max_ops, profile.bandwidth_mb,
                      say)
    rss.mark("raw")
    bookie = measure_bookie(workdir, profile, raw, rss)
    bookie["replay"] = measure_replay(workdir, profile)
    rss.mark("replay")
    memory = {"peak_rss_mb": peak_rss_mb(),
              "peak_rss_mb_after": rss.after,
              "largest_prebuilt_batch_mb": largest_prebuilt_batch_mb(profile)}
    say(f"peak RSS: {memory['peak_rss_mb']} MiB")
    return {"mode": profile.name, "dir": workdir, "python": sys.version.split()[0],
            "raw": raw, "bookie": bookie, "memory": memory,
            "targets": evaluate_targets(bookie, memory["peak_rss_mb"]),
            "elapsed_s": round(time.perf_counter() - started, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (plus the hidden options of the replay writer child)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a shorter run (under a minute)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where the fresh temporary directory is made (default: the "
                             "current directory, i.e. its disk is the one under test)")
    # Internal: the child process of the restart measurement.
    parser.add_argument("--replay-writer", metavar="BOOKIE_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--replay-entries", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --replay-writer, the child of the restart test)."""
    args = parse_args(argv)
    if args.replay_writer:
        run_replay_writer(args.replay_writer, args.replay_entries, args.window)
        return 0
    profile = QUICK if args.quick else FULL
    return run_and_report("pybk-bench-", args.dir, lambda workdir: run(profile, workdir))


if __name__ == "__main__":
    sys.exit(main())
