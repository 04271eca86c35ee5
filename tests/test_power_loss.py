"""Power loss, simulated with pybk.testing.faultyio: what was written but not synced is undone,
zeroed or garbled, then the bookie restarts."""

from __future__ import annotations

import logging
import os
import random

import pytest
from crashutil import check_bookie, children, crash_settings, read_acks, settings_of  # noqa: F401

from pybk.storage import Bookie
from pybk.testing.faultyio import MODES, FaultyFileIO, lose_unsynced, read_unsynced

log = logging.getLogger(__name__)

ROUNDS = 12
SEED = 424242


def test_faulty_io_loses_only_unsynced_writes(tmp_path):
    """The fault layer itself: a sync through any descriptor of a file protects what was
    written before it; after it, appends are undone, zeroed or garbled as asked, and an
    overwrite of synced bytes comes back old or new, never garbled."""
    path = str(tmp_path / "file")
    for mode in MODES:
        io = FaultyFileIO()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        other = os.open(path, os.O_RDONLY)
        try:
            io.write_all(fd, [b"a" * 5000])
            io.fdatasync(other)
            io.write_all(fd, [b"b" * 3000])
            io.pwrite_all(fd, b"c" * 10, 0)
        finally:
            os.close(fd)
            os.close(other)
        assert sorted(w.offset for w in io.unsynced[path]) == [0, 5000]
        assert io.crash(mode, random.Random(1)) == 3010 and not io.unsynced
        with open(path, "rb") as f:
            data = f.read()
        assert data[10:5000] == b"a" * 4990
        assert data[:10] in (b"a" * 10, b"c" * 10)
        if mode == "drop":
            assert data == b"a" * 5000
            continue
        assert len(data) == 8000
        tail = data[5000:]
        if mode == "zero":
            assert tail == bytes(3000)
        elif mode == "garble":
            assert garbled(tail)
        else:  # mixed: kept, zeroed or garbled per 4 KiB block; [5000, 8000) is in one
            assert tail in (b"b" * 3000, bytes(3000)) or garbled(tail)


def test_faulty_io_follows_renames_and_removals(tmp_path):
    """Unsynced writes move with a rename (those of the file it replaces go) and go with a
    removal, in the process and in the log a parent rebuilds them from; ``kill_when`` sees
    renames, removals and steps."""
    seen = []
    log_path = str(tmp_path / "unsynced.jsonl")
    io = FaultyFileIO(log_path, lambda op, path, offset: seen.append((op, path)) and False)
    a_new, a, b_new, b, doomed = (str(tmp_path / name)
                                  for name in ("a.new", "a", "b.new", "b", "c"))
    for path in (a_new, a, b_new, b, doomed):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            io.write_all(fd, [b"x" * 100])
            if path == b_new:
                io.fdatasync(fd)
        finally:
            os.close(fd)
    io.rename(a_new, a)  # a's unsynced write is a.new's now
    io.rename(b_new, b)  # b is b.new's synced bytes
    io.unlink(doomed)
    io.step("commit", "index")
    assert list(io.unsynced) == [a] == list(read_unsynced(log_path))
    assert seen[-4:] == [("rename", a_new), ("rename", b_new), ("unlink", doomed),
                         ("commit", "index")]
    assert lose_unsynced(read_unsynced(log_path), "drop", random.Random(1)) == 100
    assert (os.path.getsize(a), os.path.getsize(b)) == (0, 100)


def garbled(data: bytes) -> bool:
    return data.count(b"b") < len(data) // 64 and data.count(0) < len(data) // 64


@pytest.mark.timeout(180)
def test_power_loss_loop_keeps_every_acknowledged_entry(tmp_path, children):
    """Twelve power cuts under load: the child SIGKILLs itself just before its N-th sync
    (of any file, or of an entry log; N random: during recovery, before a journal group,
    an entry log's data, new header, or seal is synced), then its
    unsynced writes are undone, zeroed, garbled or a mix of those.  After each restart
    every acknowledged entry and explicit LAC is there byte-identical, and nothing else
    reads as wrong bytes."""
    values = crash_settings(tmp_path / "bookie")
    settings = settings_of(values)
    acks_path = tmp_path / "acks"
    rng = random.Random(SEED)
    touched_total = 0
    for round_no in range(ROUNDS):
        faulty_log = tmp_path / f"unsynced-{round_no}.jsonl"
        # Even rounds: the N-th sync of any file (mostly journal groups); odd rounds: of an
        # entry log (checkpoint data, a log's new header, a seal's map or header).
        suffix, kill_at = (("", rng.randint(2, 400)) if round_no % 2 == 0
                           else (".log", rng.randint(1, 16)))
        child = children.start(values, acks_path, round_no, "--faulty-log", str(faulty_log),
                               "--kill-before-sync", str(kill_at), "--kill-sync-of", suffix)
        children.wait_for_exit(child, timeout=60)
        children.assert_killed(child)
        unsynced = read_unsynced(str(faulty_log))
        mode = MODES[round_no % len(MODES)]
        touched = lose_unsynced(unsynced, mode, rng)
        touched_total += touched
        acks = read_acks(acks_path)
        with Bookie(settings) as bookie:
            survivors = check_bookie(bookie, acks)
        log.info("round %d: killed before sync %d of *%s; %s %d unsynced bytes of %s; "
                 "%d adds acknowledged so far; %d unacknowledged survivors", round_no, kill_at,
                 suffix, mode, touched, sorted(os.path.basename(p) for p in unsynced),
                 acks.count, survivors)
    assert touched_total > 0, "no round left unsynced data to lose"
