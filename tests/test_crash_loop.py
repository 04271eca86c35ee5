"""kill -9 in a loop: a loaded bookie is killed at random moments and restarted.

Each round starts ``crash_child.py`` on the same directories (it continues every ledger
after the highest entry it finds), waits for a few acknowledgements, lets it run a random
0.05-0.5 s (fixed seeds), SIGKILLs it, and checks the crash guarantee in this process.
"""

from __future__ import annotations

import logging
import os
import random
import time

import pytest
from crashutil import (  # noqa: F401
    KEY,
    MIB,
    NEW_LEDGERS_FROM,
    check_bookie,
    children,
    count_lines,
    crash_settings,
    expected_entry,
    files,
    read_acks,
    settings_of,
)

from pybk.errors import NoSuchEntry, NoSuchLedger, Unauthorized
from pybk.storage import Bookie

log = logging.getLogger(__name__)

ROUNDS = 20
SEED = 20240611
NEW_LEDGER_ROUNDS = 6


@pytest.mark.timeout(240)
def test_kill_minus_nine_loop_keeps_every_acknowledged_entry(tmp_path, children):
    """Twenty kill -9 rounds under load (4 threads, 8 ledgers, blocking and asynchronous
    adds of 24 B to 64 KiB, explicit LACs, checkpoints every 200 ms, 1 MiB journals and
    2 MiB entry logs): after each, every acknowledged entry and explicit LAC is there,
    byte-identical, and no entry id reads as anything but its own bytes or NoSuchEntry."""
    values = crash_settings(tmp_path / "bookie")
    settings = settings_of(values)
    acks_path = tmp_path / "acks"
    rng = random.Random(SEED)
    survivors = 0
    for round_no in range(ROUNDS):
        child = children.start(values, acks_path, round_no)
        children.wait_for_acks(child, acks_path, count_lines(acks_path) + 5)
        time.sleep(rng.uniform(0.05, 0.5))
        children.kill(child)
        acks = read_acks(acks_path)
        with Bookie(settings) as bookie:
            survivors += check_bookie(bookie, acks)
            replayed = bookie.replayed_records
        log.info("round %d: %d adds acknowledged so far, %d journal records replayed",
                 round_no, acks.count, replayed)
    log.info("%d unacknowledged entries survived a kill and read back exactly", survivors)
    # The rounds rolled entry logs and journals (each start begins one journal).
    assert max(os.path.getsize(path) for path in files(settings, ".log")) > MIB
    assert int(os.path.basename(files(settings, ".txn")[-1])[:16], 16) > 2 * ROUNDS


@pytest.mark.timeout(60)
def test_kill_before_a_new_entry_log_header_is_written(tmp_path, children):
    """A kill -9 just after the first checkpoint created its entry log file, before the
    header was written (the child kills itself there), must not keep the bookie from
    starting with every acknowledged entry."""
    values = crash_settings(tmp_path / "bookie")
    acks_path = tmp_path / "acks"
    child = children.start(values, acks_path, 0, "--faulty-log", str(tmp_path / "io.jsonl"),
                           "--kill-before-log-header")
    children.wait_for_exit(child, timeout=60)
    children.assert_killed(child)
    settings = settings_of(values)
    assert [os.path.getsize(path) for path in files(settings, ".log.new")] == [0]
    with Bookie(settings) as bookie:
        check_bookie(bookie, read_acks(acks_path))


@pytest.mark.timeout(120)
def test_kill_minus_nine_keeps_each_acknowledged_first_add_with_its_key(tmp_path, children):
    """Six kill -9 rounds of a child whose every add is a new ledger's first (its master
    key journaled with it): after each, every acknowledged first entry reads back with its
    ledger's key (a wrong key is refused, the right one adds the next entry), and a
    ledger the crash left behind unacknowledged has its key too, never an entry alone."""
    rng = random.Random(SEED)
    for round_no in range(NEW_LEDGER_ROUNDS):
        values = crash_settings(tmp_path / f"bookie-{round_no}")
        acks_path = tmp_path / f"acks-{round_no}"
        child = children.start(values, acks_path, round_no, "--new-ledgers")
        children.wait_for_acks(child, acks_path, 20)
        time.sleep(rng.uniform(0.05, 0.3))
        children.kill(child)
        acked = set(read_acks(acks_path).entries)
        with Bookie(settings_of(values)) as bookie:
            found = check_first_adds(bookie, acked)
        log.info("round %d: %d first adds acknowledged, %d ledgers found", round_no,
                 len(acked), found)


def check_first_adds(bookie: Bookie, acked: set[int]) -> int:
    """Check the ledgers a ``--new-ledgers`` child may have made (past the highest one
    acknowledged by more than it can have had in flight); return how many exist."""
    found = 0
    futures = []
    for ledger_id in range(NEW_LEDGERS_FROM, max(acked) + 1000):
        try:
            data = bookie.read_entry(ledger_id, 0)
        except NoSuchLedger:
            assert ledger_id not in acked, f"ledger {ledger_id} of an acknowledged add is gone"
            continue
        except NoSuchEntry:  # the key's record survived, its entry's did not
            assert ledger_id not in acked, f"acknowledged entry {ledger_id}/0 is lost"
        else:
            assert data == expected_entry(ledger_id, 0), f"entry {ledger_id}/0 reads wrong"
        found += 1
        with pytest.raises(Unauthorized):
            bookie.add_entry_async(ledger_id, 1, expected_entry(ledger_id, 1), b"another key")
        futures.append(bookie.add_entry_async(ledger_id, 1, expected_entry(ledger_id, 1), KEY))
    for future in futures:
        future.result(timeout=30)
    return found
