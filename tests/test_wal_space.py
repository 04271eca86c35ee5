"""Disk space: what truncation and deletion give back, how soon, and the bound that is
left (pybk/storage/gc.py, "Space left behind").  Real directories, real fsync; space is
counted as du counts it (allocated blocks)."""

from __future__ import annotations

import collections
import os
import time
from typing import Callable

import pytest
from conftest import KEY, entry

import pybk
from pybk.log import Position
from pybk.log.batch import BATCH_HEADER_BYTES, RECORD_OVERHEAD_BYTES
from pybk.storage.gc import space_bound_bytes
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
#: The index keeps about 70 bytes per entry at its fullest (gc.py); with room to spare.
INDEX_BYTES_PER_ENTRY = 100
#: Cookies, LastLogMarks, LMDB lock files and the WAL's metadata store.
SMALL_FILES_BYTES = 1 * MIB
#: The bound on the wait for space to come back after a truncation, a deletion or an
#: open: wide against a loaded machine, yet a tenth of the ten minutes between the
#: checkpoints and GC passes that the deletion tests set, so space back within it was
#: given back by the checkpoint the deletion asked for, not by a timer.
RECLAIM_SECONDS = WAIT_S


def _du(path) -> int:
    """Bytes the files under ``path`` occupy on disk (GC may remove some meanwhile)."""
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _wait_until(measure: Callable[[], int], limit: int, seconds: float) -> int:
    """Poll ``measure()`` until it is at most ``limit`` or ``seconds`` pass; its last
    value."""
    deadline = time.monotonic() + seconds
    value = measure()
    while value > limit and time.monotonic() < deadline:
        time.sleep(0.1)
        value = measure()
    return value


def _segment_bytes(positions: list[Position], record_bytes: int) -> dict[int, int]:
    """Bytes of batches per segment, as the writer counts them against segmentMaxBytes."""
    records_per_entry = collections.Counter((p.segment, p.entry) for p in positions)
    sizes: dict[int, int] = collections.defaultdict(int)
    for (segment, _entry), count in records_per_entry.items():
        sizes[segment] += BATCH_HEADER_BYTES + count * (RECORD_OVERHEAD_BYTES + record_bytes)
    return sizes


def test_truncating_a_wal_gives_its_space_back_within_the_documented_bound(tmp_path):
    """100 MiB appended in 4 MiB segments with the default settings, then truncated
    before the last record: soon after (RECLAIM_SECONDS at most), and after a close and
    an open, the directory holds the last segment plus at most space_bound_bytes (53 MiB
    with a WAL's defaults), the index and a few small files."""
    directory = tmp_path / "wal"
    record_bytes, segment_max = 4096, 4 * MIB
    with pybk.open(directory, segmentMaxBytes=segment_max) as wal:
        futures = [wal.append_async(os.urandom(record_bytes))
                   for _ in range(100 * MIB // record_bytes)]
        positions = [future.result(timeout=60) for future in futures]
        settings = wal.bookie.settings
        assert space_bound_bytes(settings) == 53 * MIB
        batch_max = wal._writer.settings.batchMaxBytes
        sizes = _segment_bytes(positions, record_bytes)
        assert max(sizes.values()) <= segment_max + batch_max, \
            f"segments of {sorted(sizes.values())} bytes; segmentMaxBytes is {segment_max}"
        full = _du(directory)
        assert full >= 100 * MIB

        last = positions[-1]
        wal.truncate(last)
        kept = sizes[last.segment]
        entries = len({(p.segment, p.entry) for p in positions})
        bound = (kept + space_bound_bytes(settings) + INDEX_BYTES_PER_ENTRY * entries
                 + SMALL_FILES_BYTES)
        started = time.monotonic()
        used = _wait_until(lambda: _du(directory), bound, RECLAIM_SECONDS)
        assert used <= bound, (f"{used} bytes used {time.monotonic() - started:.1f} s after "
                               f"truncation; the bound is {bound} (was {full})")
    assert _du(directory) <= bound

    with pybk.open(directory) as wal:
        assert [p for p, _ in wal.read()] == [last]
        used = _wait_until(lambda: _du(directory), bound, RECLAIM_SECONDS)
        assert used <= bound, f"{used} bytes used after reopening; the bound is {bound}"


def _entry_log_bytes(settings) -> int:
    return sum(_du(os.path.join(d, "current")) for d in settings.ledgerDirectories
               if os.path.isdir(os.path.join(d, "current")))


def _fill(bookie, ledger_id: int, count: int, body: bytes) -> None:
    futures = [bookie.add_entry_async(ledger_id, e, entry(ledger_id, e, body), KEY)
               for e in range(count)]
    for future in futures:
        future.result(timeout=30)


def test_a_deletion_gives_its_space_back_at_once_whatever_the_intervals(settings_factory,
                                                                      bookie_factory):
    """With checkpoints and GC 10 minutes apart, deleting a ledger still frees its entry
    logs well before either interval: the deletion asks for a checkpoint, which wakes GC."""
    settings = settings_factory(flushInterval=600_000, gcWaitTime=600_000,
                                diskCheckInterval=600_000, logSizeLimit=MIB,
                                maxEntrySizeBytes=64 * 1024, ledgerDirectories=(
                                    settings_factory().ledgerDirectories[0],))
    bookie = bookie_factory(settings)
    _fill(bookie, 1, 80, bytes(60 * 1024))  # 4.7 MiB: four full logs and a part
    _fill(bookie, 2, 4, b"live")
    bookie.checkpoint()
    before = _entry_log_bytes(settings)
    assert before >= 4 * MIB
    bookie.delete_ledger(1)
    after = _wait_until(lambda: _entry_log_bytes(settings), 2 * MIB, RECLAIM_SECONDS)
    assert after <= 2 * MIB, f"entry logs still hold {after} of {before} bytes"
    assert bookie.read_entry(2, 3) == entry(2, 3, b"live")


def test_an_opening_bookie_collects_what_was_deleted_before(settings_factory,
                                                            bookie_factory):
    """Deletions made durable before a restart are collected when the bookie starts, not
    one gcWaitTime later."""
    settings = settings_factory(flushInterval=600_000, gcWaitTime=600_000,
                                diskCheckInterval=600_000, logSizeLimit=MIB,
                                maxEntrySizeBytes=64 * 1024, ledgerDirectories=(
                                    settings_factory().ledgerDirectories[0],))
    bookie = bookie_factory(settings, start_background_threads=False)  # no GC runs
    _fill(bookie, 1, 80, bytes(60 * 1024))
    _fill(bookie, 2, 4, b"live")
    bookie.checkpoint()
    bookie.delete_ledger(1)
    bookie.checkpoint()
    bookie.close()
    before = _entry_log_bytes(settings)
    assert before >= 4 * MIB
    bookie = bookie_factory(settings)
    after = _wait_until(lambda: _entry_log_bytes(settings), 2 * MIB, RECLAIM_SECONDS)
    assert after <= 2 * MIB, f"entry logs still hold {after} of {before} bytes"
    assert bookie.read_entry(2, 3) == entry(2, 3, b"live")
