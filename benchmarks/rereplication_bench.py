#!/usr/bin/env python3
"""Benchmark of re-replication: a bookie holding a share of 1 GiB is killed, and the
cluster's own autorecovery copies its share back, beside the raw disk of the same run.

Usage::

    python benchmarks/rereplication_bench.py [--quick] [--dir DIR] [--config NAME]...
                                            [--mib N] [--bookie-set KEY=VALUE]...

For each configuration (``e3_qw2_qa2`` by default; ``e3_qw3_qa2`` too), on a fresh
:class:`~pybk.testing.local_cluster.LocalCluster` (a real ZooKeeper and five ``pybk bookie``
processes with default settings: each takes part in autorecovery, i.e. the auditor
election and a replication worker):

1. a client here writes ``--mib`` MiB (1,024 full, 128 quick) of 1 KiB entries spread
   evenly over 100 ledgers, round-robin, pipelined (the client's ``throttle`` of
   outstanding adds is the window), and closes them;
2. the bookie holding the most entries (from the write sets) is killed with SIGKILL;
3. the metadata store is polled until the ledgers are fully replicated: no mark of
   under-replication is left and no ledger gives the dead bookie an entry.  Stages,
   in seconds from the kill: its registration gone (its ZooKeeper session expired,
   ``zkTimeout``), the first mark seen, every ledger marked (the time of the auditor's
   log line that ends its audit), fully replicated;
4. a sample of every ledger (its first and last entry and random ones, most of them
   entries the dead bookie held) is read from each bookie of its write set in the new
   metadata, directly: the copies must be byte-identical and decode (digest) to what
   was written, or the run fails.

Bytes copied are the dead bookie's share: the entries its write sets gave it, at their
stored size (1 KiB of payload plus the entry header and digest), cross-checked with
what the workers log.  The copy rate counts from the first mark (before it, the cluster
waits for the dead bookie's session to expire); the survivors' CPU while copying says
whether the machine's cores were the bound.  Progress goes to stderr; stdout gets one
JSON line (see ``benchmarks/README.md``).  Targets are reported, never asserted: the exit code is
non-zero only if the benchmark itself fails (an add refused, replication not done
within ``REPLICATION_TIMEOUT_S``, a copy read back wrong).

``--one-worker`` measures one worker alone instead: the bookies run no autorecovery
(``autoRecoveryDaemonEnabled=false``), and once the dead bookie's registration is gone
this process repairs the ledgers it held, one after the other, with one
:class:`~pybk.autorecovery.rereplication.LedgerRepair` (a worker's copier, default
settings), reporting the CPU per entry copied of that worker's thread, of this
process's other threads (the client's ZeroMQ loop) and of the survivors.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from cluster_bench import process_cpu_s  # noqa: E402
from rawdisk import MIB, mb_per_s, ratio, raw_durable_bandwidth, run_and_report  # noqa: E402

import pybk  # noqa: E402
from pybk.autorecovery.replicas import bookie_holds_entries, coverage  # noqa: E402
from pybk.autorecovery.rereplication import LedgerRepair  # noqa: E402
from pybk.client.bookkeeper import BookKeeper  # noqa: E402
from pybk.client.digest import DigestManager  # noqa: E402
from pybk.client.ledger import LedgerHandle  # noqa: E402
from pybk.meta.ledger_metadata import LedgerMetadata  # noqa: E402
from pybk.meta.ledgers import LedgerManager  # noqa: E402
from pybk.meta.underreplication import UnderreplicationManager  # noqa: E402
from pybk.meta.zookeeper import ZooKeeperMetadataStore  # noqa: E402
from pybk.settings import ServerSettings  # noqa: E402
from pybk.storage.cookie import read_cookie  # noqa: E402
from pybk.testing.local_cluster import LocalCluster  # noqa: E402

ENTRY_BYTES = 1024                 # payload of each entry
LEDGERS = 100
BOOKIES = 5
#: name in the JSON -> (ensemble size, write quorum, ack quorum)
CONFIGS = {"e3_qw2_qa2": (3, 2, 2), "e3_qw3_qa2": (3, 3, 2)}
#: Entries added to one ledger before the writer moves to the next (round-robin), so
#: that every bookie is busy and many entries of a ledger travel in one ADD message.
WRITE_RUN_ENTRIES = 200
#: Entries read back from every bookie of their write set, per ledger, besides the first
#: and the last (drawn from those the dead bookie held, when it held some).
SAMPLE_ENTRIES = 20
SAMPLE_SEED = 17
#: What the raw bandwidth test writes, MiB (full, quick).
RAW_BANDWIDTH_MB = (512, 128)

# Bounds on every wait (the writes' are the client's: an add waits for a free slot of
# its throttle, a close for its adds, each at most about addEntryTimeout).
CLUSTER_START_TIMEOUT_S = 120.0
REPLICATION_TIMEOUT_S = 1800.0     # from the kill to full replication
READ_TIMEOUT_S = 30.0              # one sampled read
POLL_S = 0.1                       # between looks at the metadata store
#: ``--one-worker``: the bookies' ZooKeeper session timeout, so that the dead bookie's
#: registration goes soon (nothing is marked: no auditor runs).
ONE_WORKER_ZK_TIMEOUT_MS = 4000

#: Re-replication copies at least as fast as the cluster took the same entries from a
#: writer (bytes per second, in the same run): lost copies are restored as fast as the
#: writers make new ones.
TARGET_COPY_TO_WRITE = 1.0

#: What a replication worker logs per ledger it repaired
#: (:mod:`pybk.autorecovery.worker`); summed to cross-check the bytes copied.
_REPLICATED_LOG = re.compile(r"ledger \d+ re-replicated \((\d+) entries, (\d+) bytes copied\)")
#: What the auditor logs once it marked the ledgers of lost bookies
#: (:mod:`pybk.autorecovery.auditor`), after ``pybk``'s log format (time, level, logger).
_AUDIT_LOG = re.compile(r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING "
                        r"pybk\.cluster\.auditor: auditor \S+: bookies (?P<lost>.+) lost: "
                        r"marked (?P<marked>\d+) ledgers under-replicated$", re.MULTILINE)
_FILL = bytes((i * 131 + 7) % 256 for i in range(ENTRY_BYTES))


def say(message: str) -> None:
    """A progress line (stderr, so that stdout holds only the JSON result)."""
    print(f"[rereplication_bench] {message}", file=sys.stderr, flush=True)


def payload(ledger_id: int, entry_id: int) -> bytes:
    """The 1 KiB payload of an entry: its ledger and entry id, then fixed filler, so that
    an entry copied to the wrong place is told apart."""
    return struct.pack(">QQ", ledger_id, entry_id) + _FILL[16:]


# -- writing ----------------------------------------------------------------------------

class Acks:
    """Counts acknowledged adds and keeps the failures (callbacks come on the client's
    threads, one at a time per ledger)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acked = 0
        self.errors: list[BaseException] = []

    def __call__(self, entry_id: int | None, error: BaseException | None) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(error)
            else:
                self.acked += 1


def write_ledgers(bk: BookKeeper, quorums: tuple[int, int, int], entries_per_ledger: int
                  ) -> tuple[list[int], dict]:
    """Create :data:`LEDGERS` ledgers, add ``entries_per_ledger`` entries to each (runs of
    :data:`WRITE_RUN_ENTRIES`, round-robin, all pipelined), close them; their ids and the
    write's figures."""
    started = time.perf_counter()
    ledgers: list[LedgerHandle] = [bk.create_ledger(*quorums) for _ in range(LEDGERS)]
    acks = Acks()
    for first in range(0, entries_per_ledger, WRITE_RUN_ENTRIES):
        for ledger in ledgers:
            for entry_id in range(first, min(first + WRITE_RUN_ENTRIES, entries_per_ledger)):
                ledger.add_entry_then(payload(ledger.id, entry_id), acks)
        if acks.errors:
            break
    for ledger in ledgers:
        ledger.close()  # waits for its adds (bounded by addEntryTimeout)
    seconds = time.perf_counter() - started
    if acks.errors:
        raise RuntimeError(f"{len(acks.errors)} adds failed; first: {acks.errors[0]!r}")
    total = entries_per_ledger * LEDGERS
    for ledger in ledgers:
        if ledger.metadata.last_entry_id != entries_per_ledger - 1:
            raise RuntimeError(f"ledger {ledger.id} closed at entry "
                               f"{ledger.metadata.last_entry_id}, not {entries_per_ledger - 1}")
    if acks.acked != total:
        raise RuntimeError(f"{acks.acked} adds acknowledged, not {total}")
    return [ledger.id for ledger in ledgers], {
        "entries": total, "seconds": round(seconds, 2),
        "entries_per_s": round(total / seconds, 1),
        "mb_per_s": mb_per_s(total * ENTRY_BYTES, seconds)}


def entries_held(metadata: dict[int, LedgerMetadata], bookie_id: str) -> int:
    """How many entries of these (closed) ledgers the write sets give ``bookie_id``."""
    return sum(coverage(m, {bookie_id}).short_entries for m in metadata.values())


# -- watching the repair ----------------------------------------------------------------

@dataclass
class Repair:
    """What :func:`watch_repair` saw: seconds from the kill to each stage (None: not
    seen), marks of other ledgers, and the survivors' CPU seconds at the kill, at the
    first mark (at the kill if none was seen) and at the end."""

    unregistered_s: float | None = None
    first_mark_s: float | None = None
    replicated_s: float = 0.0
    other_marks: set[int] = field(default_factory=set)  # ledgers the dead bookie held none of
    cpu_at_kill_s: float = 0.0
    cpu_at_first_mark_s: float = 0.0
    cpu_at_end_s: float = 0.0


def watch_repair(store: ZooKeeperMetadataStore, victim: str, affected: set[int],
                 killed_mono: float, survivors_cpu_s: Callable[[], float]) -> Repair:
    """Poll the store every :data:`POLL_S` until no mark is left and no ledger of
    ``affected`` gives ``victim`` an entry (TimeoutError after
    :data:`REPLICATION_TIMEOUT_S`).  A ledger's metadata is read only while no mark is
    left, and no longer once it gives ``victim`` nothing (the dead bookie does not come
    back), so the looks cost the machine little while the copies run."""
    manager = UnderreplicationManager(store)
    ledgers = LedgerManager(store)
    cpu_s = survivors_cpu_s()
    repair = Repair(cpu_at_kill_s=cpu_s, cpu_at_first_mark_s=cpu_s)
    pending = set(affected)  # ledgers whose metadata may still give the victim entries
    while pending:
        now = time.monotonic() - killed_mono
        if now > REPLICATION_TIMEOUT_S:
            raise TimeoutError(f"not fully replicated within {REPLICATION_TIMEOUT_S:.0f} s: "
                               f"{len(pending)} ledgers still give {victim} entries")
        if repair.unregistered_s is None and victim not in store.bookies():
            repair.unregistered_s = round(now, 2)
        marked = set(manager.ledger_ids())
        repair.other_marks |= marked - affected
        if marked and repair.first_mark_s is None:
            repair.first_mark_s = round(now, 2)
            repair.cpu_at_first_mark_s = survivors_cpu_s()
        if not marked and repair.unregistered_s is not None:
            pending = {ledger_id for ledger_id in pending
                       if bookie_holds_entries(ledgers.read(ledger_id).metadata, victim)}
        if pending:
            time.sleep(POLL_S)
    repair.replicated_s = round(time.monotonic() - killed_mono, 2)
    repair.cpu_at_end_s = survivors_cpu_s()
    return repair


# -- what the bookies logged ------------------------------------------------------------

def bookie_logs(cluster: LocalCluster, ids: list[str]) -> dict[str, str]:
    """Each bookie's log (``bookie<N>/bookie.log``), by bookie id."""
    logs = {}
    for number, bookie_id in enumerate(ids, 1):
        with open(os.path.join(cluster.directory, f"bookie{number}", "bookie.log"),
                  encoding="utf-8", errors="replace") as f:
            logs[bookie_id] = f.read()
    return logs


def logged_copies(logs: dict[str, str]) -> dict:
    """What each bookie's replication worker logged it copied: ledgers, entries, bytes."""
    per_bookie = {}
    for bookie_id, text in logs.items():
        found = [tuple(map(int, m.groups())) for m in _REPLICATED_LOG.finditer(text)]
        per_bookie[bookie_id] = {"ledgers": len(found), "entries": sum(e for e, _ in found),
                                 "bytes": sum(b for _, b in found)}
    return per_bookie


def logged_audit(logs: dict[str, str], victim: str) -> tuple[float, int] | None:
    """When the auditor had marked every ledger of ``victim`` (the wall-clock time of its
    log line, which it writes once the audit's marks are made) and how many it marked;
    None if no auditor logged it."""
    for text in logs.values():
        for m in _AUDIT_LOG.finditer(text):
            if victim in m.group("lost").split(", "):
                when = datetime.strptime(m.group("time"), "%Y-%m-%d %H:%M:%S,%f")
                return when.timestamp(), int(m.group("marked"))
    return None


# -- verifying --------------------------------------------------------------------------

def sample(rng: random.Random, metadata: LedgerMetadata, victim: str) -> set[int]:
    """The first and last entry of a closed ledger and up to :data:`SAMPLE_ENTRIES`
    random ones, all of them among those ``victim`` held if it held any."""
    last = metadata.last_entry_id
    held = bookie_holds_entries(metadata, victim)
    chosen = {0, last}
    for _ in range(SAMPLE_ENTRIES * 10):  # bounded: most draws qualify
        if len(chosen) >= SAMPLE_ENTRIES + 2:
            break
        entry_id = rng.randint(0, last)
        if not held or victim in metadata.write_set(entry_id):
            chosen.add(entry_id)
    return chosen


def verify_copies(bk: BookKeeper, before: dict[int, LedgerMetadata], victim: str) -> dict:
    """Read a sample of every ledger from each bookie of its write set in the current
    metadata, directly; every copy must be byte-identical and decode to the entry
    written.  Raises RuntimeError at the first difference; returns what was read."""
    rng = random.Random(SAMPLE_SEED)
    reads = copies = 0
    for ledger_id, old in before.items():
        metadata = bk.ledger_manager.read(ledger_id).metadata
        if bookie_holds_entries(metadata, victim):
            raise RuntimeError(f"ledger {ledger_id} still gives {victim} entries")
        digest = DigestManager(ledger_id, metadata.digest_type, b"")
        asked = [(entry_id, bookie_id, bk.bookie_client(bookie_id).read(ledger_id, entry_id))
                 for entry_id in sorted(sample(rng, old, victim))
                 for bookie_id in metadata.write_set(entry_id)]
        stored: dict[int, bytes] = {}
        for entry_id, bookie_id, future in asked:
            data = future.result(timeout=READ_TIMEOUT_S)
            reads += 1
            copies += bookie_id not in old.write_set(entry_id)
            if stored.setdefault(entry_id, data) != data:
                raise RuntimeError(f"ledger {ledger_id} entry {entry_id}: bookie {bookie_id} "
                                   "holds other bytes than the rest of its write set")
            if digest.decode(entry_id, data).data != payload(ledger_id, entry_id):
                raise RuntimeError(f"ledger {ledger_id} entry {entry_id} on bookie "
                                   f"{bookie_id} is not the entry written")
    if not copies:
        raise RuntimeError("the sample read no copy made by re-replication")
    return {"ledgers": len(before), "reads": reads, "copies_read": copies}


# -- one configuration ------------------------------------------------------------------

def bookie_ids(cluster: LocalCluster) -> list[str]:
    """The id of each bookie process of the cluster, in ``cluster.processes``' order: the
    id its cookie recorded when it joined."""
    ids = []
    for number in range(1, len(cluster.processes) + 1):
        found = read_cookie(os.path.join(cluster.directory, f"bookie{number}", "ledgers"))
        if found is None or found[0].bookie_id is None:
            raise RuntimeError(f"bookie {number} has no cookie naming its id")
        ids.append(found[0].bookie_id)
    return ids


def cpu_of(pids: list[int], kernel_only: bool = False) -> float:
    """CPU seconds (``kernel_only``: in the kernel) used so far by the processes ``pids``."""
    return sum(process_cpu_s(pid, kernel_only) for pid in pids)


def measure_config(workdir: str, name: str, quorums: tuple[int, int, int], mib: int,
                   bookie_args: list[str], raw_mb_s: float) -> dict:
    """Write, kill, wait for the repair, verify: one configuration on a fresh cluster."""
    entries_per_ledger = max(1, mib * MIB // ENTRY_BYTES // LEDGERS)
    started = time.perf_counter()
    with LocalCluster(BOOKIES, os.path.join(workdir, name), bookie_args=bookie_args,
                      start_timeout_s=CLUSTER_START_TIMEOUT_S) as cluster:
        say(f"{name}: cluster of {BOOKIES} bookies up ({time.perf_counter() - started:.1f} s)")
        ids = bookie_ids(cluster)
        with pybk.connect(cluster.address) as bk, \
                ZooKeeperMetadataStore(cluster.address) as store:
            ledger_ids, written = write_ledgers(bk, quorums, entries_per_ledger)
            say(f"{name}: wrote {written['entries']:,} entries in {written['seconds']} s "
                f"({written['entries_per_s']:,.0f} entries/s, {written['mb_per_s']} MiB/s)")
            before = {ledger_id: bk.ledger_manager.read(ledger_id).metadata
                      for ledger_id in ledger_ids}
            held = {bookie_id: entries_held(before, bookie_id) for bookie_id in ids}
            victim = max(ids, key=held.__getitem__)
            affected = {ledger_id for ledger_id, m in before.items()
                        if bookie_holds_entries(m, victim)}
            entry_bytes = ENTRY_BYTES + DigestManager(0, before[ledger_ids[0]].digest_type,
                                                      b"").overhead
            copied_bytes = held[victim] * entry_bytes
            process = cluster.processes[ids.index(victim)]
            survivors = [p.pid for p in cluster.processes if p is not process]
            auditor = UnderreplicationManager(store).auditor()
            say(f"{name}: killing {victim} (pid {process.pid}), which holds "
                f"{held[victim]:,} entries ({copied_bytes / MIB:.1f} MiB) of "
                f"{len(affected)} ledgers; the auditor is {auditor}")
            own_cpu_at_kill = time.process_time()
            kernel_at_kill = cpu_of(survivors, kernel_only=True)
            killed_wall, killed_mono = time.time(), time.monotonic()
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            repair = watch_repair(store, victim, affected, killed_mono,
                                  lambda: cpu_of(survivors))
            own_cpu = time.process_time() - own_cpu_at_kill
            kernel_s = cpu_of(survivors, kernel_only=True) - kernel_at_kill
            say(f"{name}: fully replicated {repair.replicated_s} s after the kill "
                f"(unregistered at {repair.unregistered_s} s, first mark at "
                f"{repair.first_mark_s} s)")
            checked = verify_copies(bk, before, victim)
            say(f"{name}: {checked['reads']:,} sampled reads identical, "
                f"{checked['copies_read']:,} of them of copies")
        logs = bookie_logs(cluster, ids)
    logged = logged_copies(logs)
    audit = logged_audit(logs, victim)
    all_marked_s = round(audit[0] - killed_wall, 2) if audit else None
    # Copying starts with the first mark; a repair quicker than a look at the store
    # counts from the end of the audit.
    copy_from_s = repair.first_mark_s if repair.first_mark_s is not None else all_marked_s
    if copy_from_s is None:
        raise RuntimeError(f"no mark seen and no audit of {victim} logged: the ledgers were "
                           "not repaired by autorecovery")
    copy_s = max(repair.replicated_s - copy_from_s, POLL_S)
    copy_mb_s = mb_per_s(copied_bytes, copy_s)
    copy_cpu_s = repair.cpu_at_end_s - repair.cpu_at_first_mark_s
    figures = {
        "ensemble": quorums[0], "write_quorum": quorums[1], "ack_quorum": quorums[2],
        "ledgers": LEDGERS, "entries_per_ledger": entries_per_ledger, "written": written,
        "entries_held": held, "victim": victim, "victim_was_auditor": victim == auditor,
        "ledgers_affected": len(affected),
        "copied": {"entries": held[victim], "entry_bytes": entry_bytes,
                   "bytes": copied_bytes, "mb": round(copied_bytes / MIB, 1),
                   "logged_by_workers": logged,
                   "logged_bytes": sum(w["bytes"] for w in logged.values())},
        "stages_s": {"unregistered": repair.unregistered_s,
                     "first_mark": repair.first_mark_s, "all_marked": all_marked_s,
                     "replicated": repair.replicated_s},
        "marks": {"expected": len(affected), "auditor_marked": audit[1] if audit else None,
                  "others_seen": len(repair.other_marks)},
        "copy_seconds": round(copy_s, 2), "copy_mb_per_s": copy_mb_s,
        "copy_entries_per_s": round(held[victim] / copy_s, 1),
        "kill_to_replicated_mb_per_s": mb_per_s(copied_bytes, repair.replicated_s),
        "copy_to_raw_bandwidth": ratio(copy_mb_s, raw_mb_s),
        "copy_to_write": ratio(copy_mb_s, mb_per_s(written["entries"] * entry_bytes,
                                                   written["seconds"])),
        "cpu": {"survivors_s": round(repair.cpu_at_end_s - repair.cpu_at_kill_s, 2),
                "survivors_kernel_share": ratio(kernel_s,
                                                repair.cpu_at_end_s - repair.cpu_at_kill_s),
                "survivors_while_copying_s": round(copy_cpu_s, 2),
                "survivors_us_per_entry": round(copy_cpu_s / held[victim] * 1e6, 1),
                "survivors_cores_busy": round(copy_cpu_s / copy_s, 2),
                "this_process_s": round(own_cpu, 2)},
        "verified": checked,
        "elapsed_s": round(time.perf_counter() - started, 1)}
    say(f"{name}: every ledger marked {all_marked_s} s after the kill; copied "
        f"{figures['copied']['mb']} MiB in {copy_s:.2f} s from the first mark on: "
        f"{copy_mb_s} MiB/s, {figures['copy_to_raw_bandwidth']} of the raw disk's "
        f"{raw_mb_s} MiB/s and {figures['copy_to_write']} of the write rate; survivors' CPU "
        f"{figures['cpu']['survivors_us_per_entry']} µs per entry, "
        f"{figures['cpu']['survivors_cores_busy']} cores busy")
    return figures


def measure_one_worker(workdir: str, name: str, quorums: tuple[int, int, int], mib: int,
                       bookie_args: list[str]) -> dict:
    """Write, kill, repair in this process with one worker's copier, verify (see the
    module docstring's ``--one-worker``)."""
    entries_per_ledger = max(1, mib * MIB // ENTRY_BYTES // LEDGERS)
    bookie_args = ["--set", "autoRecoveryDaemonEnabled=false", "--set",
                   f"zkTimeout={ONE_WORKER_ZK_TIMEOUT_MS}", *bookie_args]
    with LocalCluster(BOOKIES, os.path.join(workdir, name), bookie_args=bookie_args,
                      start_timeout_s=CLUSTER_START_TIMEOUT_S) as cluster:
        ids = bookie_ids(cluster)
        with pybk.connect(cluster.address) as bk:
            ledger_ids, written = write_ledgers(bk, quorums, entries_per_ledger)
            before = {ledger_id: bk.ledger_manager.read(ledger_id).metadata
                      for ledger_id in ledger_ids}
            victim = max(ids, key=lambda bookie_id: entries_held(before, bookie_id))
            process = cluster.processes[ids.index(victim)]
            survivors = [p.pid for p in cluster.processes if p is not process]
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            deadline = time.monotonic() + REPLICATION_TIMEOUT_S
            while victim in bk.metadata.bookies():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{victim} still registered after the kill")
                time.sleep(POLL_S)
            say(f"{name}: {victim} killed and unregistered; one worker repairs its ledgers")
            repair = LedgerRepair(bk, ServerSettings(), threading.Event())
            affected = [ledger_id for ledger_id, metadata in before.items()
                        if bookie_holds_entries(metadata, victim)]
            at = (time.perf_counter(), time.thread_time(), time.process_time(),
                  cpu_of(survivors))
            entries = sum(repair.run(ledger_id, (victim,), True).entries
                          for ledger_id in affected)
            wall_s, thread_s, process_s, survivors_s = (
                end - start for end, start in zip((time.perf_counter(), time.thread_time(),
                                                   time.process_time(), cpu_of(survivors)),
                                                  at))
            checked = verify_copies(bk, before, victim)
    figures = {
        "ensemble": quorums[0], "write_quorum": quorums[1], "ack_quorum": quorums[2],
        "ledgers_affected": len(affected), "entries_copied": entries,
        "entries_expected": entries_held(before, victim), "copy_seconds": round(wall_s, 2),
        "copy_entries_per_s": round(entries / wall_s, 1),
        "copy_mb_per_s": mb_per_s(entries * ENTRY_BYTES, wall_s),
        "us_per_entry": {"worker_thread": round(thread_s / entries * 1e6, 1),
                         "other_threads": round((process_s - thread_s) / entries * 1e6, 1),
                         "survivors": round(survivors_s / entries * 1e6, 1)},
        "verified": checked, "written": written}
    say(f"{name}: one worker copied {entries:,} entries in {wall_s:.2f} s; CPU per entry "
        f"{figures['us_per_entry']}")
    return figures


# -- the run ----------------------------------------------------------------------------

def run(args: argparse.Namespace, workdir: str) -> dict:
    """The raw disk, then every configuration asked for; the JSON-ready result."""
    started = time.perf_counter()
    load_1m = os.getloadavg()[0]
    mib = args.mib or (128 if args.quick else 1024)
    say(f"{'quick' if args.quick else 'full'} run in {workdir}: {mib} MiB per configuration; "
        f"load average {load_1m:.2f} on {os.cpu_count()} CPUs (other work on the machine "
        "skews every figure)")
    bookie_args = [option for setting in args.bookie_set for option in ("--set", setting)]
    if args.one_worker:
        return {"mode": "one worker", "python": sys.version.split()[0],
                "load_average_1m_at_start": round(load_1m, 2), "mib_written": mib,
                "configs": {name: measure_one_worker(workdir, name, CONFIGS[name], mib,
                                                     bookie_args)
                            for name in args.config}}
    raw_mb_s = raw_durable_bandwidth(workdir, RAW_BANDWIDTH_MB[bool(args.quick)])
    say(f"raw durable sequential write: {raw_mb_s} MiB/s")
    results = {name: measure_config(workdir, name, CONFIGS[name], mib, bookie_args, raw_mb_s)
               for name in args.config}
    reference = results[args.config[0]]
    value = reference["copy_to_write"]
    targets = {"copy_to_write": {
        "value": value, "target": f">= {TARGET_COPY_TO_WRITE:g} ({args.config[0]})",
        "pass": value >= TARGET_COPY_TO_WRITE}}
    say(f"target copy_to_write: {value} (want >= {TARGET_COPY_TO_WRITE:g}): "
        f"{'pass' if targets['copy_to_write']['pass'] else 'MISSED'}")
    return {"mode": "quick" if args.quick else "full", "dir": workdir,
            "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "load_average_1m_at_start": round(load_1m, 2), "mib_written": mib,
            "entry_bytes": ENTRY_BYTES, "bookies": BOOKIES, "bookie_settings": args.bookie_set,
            "raw": {"durable_write_mb_s": raw_mb_s}, "configs": results, "targets": targets,
            "elapsed_s": round(time.perf_counter() - started, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB instead of 1 GiB")
    parser.add_argument("--mib", type=int, help="MiB of entries to write (overrides the "
                        "profile's 1,024 or 128)")
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS),
                        help="a configuration to measure (repeatable; default: e3_qw2_qa2)")
    parser.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every bookie (pybk bookie --set; repeatable)")
    parser.add_argument("--one-worker", action="store_true",
                        help="one worker's copier in this process, alone (see the docstring)")
    parser.add_argument("--dir", default=os.getcwd(),
                        help="where the fresh temporary directory is made (default: the "
                             "current directory, i.e. its disk is the one under test)")
    args = parser.parse_args(argv)
    if args.mib is not None and args.mib < 1:
        parser.error(f"--mib must be at least 1, not {args.mib}")
    args.config = args.config or ["e3_qw2_qa2"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the cluster is stopped and the directory removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return run_and_report("pybk-rereplication-bench-", args.dir,
                          lambda workdir: run(args, workdir))


if __name__ == "__main__":
    sys.exit(main())
