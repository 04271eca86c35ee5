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
    MIB,
    check_bookie,
    children,
    count_lines,
    crash_settings,
    files,
    read_acks,
    settings_of,
)

from pybk.storage import Bookie

log = logging.getLogger(__name__)

ROUNDS = 20
SEED = 20240611


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
