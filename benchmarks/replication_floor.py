"""The floor of a replicated add on this machine: what E=3/Qw=3/Qa=2 costs with no
protocol at all, only Python, pyzmq and a group-committed fdatasync on each server.

Used by ``cluster_bench.py`` (its ``replication_floor`` figures), beside pybk's own
phases, so that pybk's latency, throughput and CPU per entry can be read against the
least the same machine needs for the same work.

The servers (:func:`serve_durable_group_echo`, each its own process) do what a bookie's
journal cannot avoid: take every message that is ready, write all their entries in one
``writev``, ``fdatasync`` once (into a file of zeros synced beforehand, as pybk's journal
is), and answer each message with its header.  The client (:class:`FloorClient`, one
thread) does what a ledger cannot avoid: send each batch of entries to every server
(one message each: a header frame, ``BATCH``, then the entries back to back in one
frame), and count the answers per entry, an entry being acknowledged once
``ack_quorum`` servers answered for it.  No checksums, no ids, no futures, no index,
no entry logs: everything pybk does beyond this is above the floor.

**The formats' floor** (``formats=True`` on both sides) is a store with BookKeeper's
formats and no protocol, done with pybk's own codecs: the client encodes each entry with
its header and CRC-32C digest (:class:`pybk.client.digest.DigestManager`, as a ledger
does); a server (:class:`_Store`) reads each entry's header and checks its ledger and
id, and writes each entry to its journal behind its record header (length, CRC-32C,
type: :mod:`pybk.storage.journal_codec`); once :data:`ENTRY_LOG_FLUSH_BYTES` of entries
are journaled, it writes them again into an entry log behind the same record headers,
``fdatasync`` s it and puts their index locations into LMDB in one synced transaction
(:meth:`pybk.storage.index.Index.record_items`), as a bookie's checkpoint does.  Like a
bookie's, its journal and entry log are new files (the journal zero-filled a MiB at a
time ahead of its records), so every entry lands in new page-cache pages twice, which
the replication floor's rewritten file never does.
No ledger state, fencing, write cache, futures or per-entry callbacks: what pybk spends
beyond the formats' floor is its own Python, not its formats or its files.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from array import array

import lmdb
import zmq
from rawdisk import latency_summary, prepare_zero_fill

from pybk.checksum import crc32c
from pybk.client.digest import DigestManager
from pybk.meta.ledger_metadata import DigestType
from pybk.storage import journal_codec as codec
from pybk.storage.entries import ENTRY_HEADER
from pybk.storage.index import Index

LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"
HWM = 100_000                       # high-water marks well above any window
SYNC_FILE_BYTES = 64 * 1024 * 1024  # each server's file of zeros, rewritten from its start
IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers in one pwritev at most
MAX_BATCH = 1000                    # entries in one message at most (pybk's batches are smaller)
#: A message's header and its answer: the first entry's sequence number, the entries.
BATCH = struct.Struct(">QI")
RECV_TIMEOUT_S = 10.0               # no answer for this long fails the run
#: An open-loop client wakes at least this often, then sends every entry that fell due
#: (as ``cluster_bench``'s open-loop producer does for pybk).
TICK_S = 0.001
#: The formats' floor: the ledger every entry names; the bytes of entries journaled
#: between two entry-log writes (about what a bookie journals between two checkpoints
#: at full load); how far its journal is zero-filled ahead, in steps of a MiB after a
#: group (pybk's ``journalPreAllocSizeMB`` and ``ZERO_FILL_STEP``); where its journal
#: and entry log start again from their beginning (a GiB: past a quick run's writes,
#: so that disk use stays bounded in a long one); the index's keys (entry ids modulo
#: this, so that the index stays small).
FORMATS_LEDGER = 1
ENTRY_LOG_FLUSH_BYTES = 32 * 1024 * 1024
JOURNAL_PREALLOC_BYTES = 16 * 1024 * 1024
ZERO_FILL_STEP = 1024 * 1024
STORE_FILE_BYTES = 1024 * 1024 * 1024
INDEX_KEYS = 1 << 20
INDEX_MAP_BYTES = 1 << 30


def serve_durable_group_echo(directory: str, formats: bool = False) -> None:
    """Child process: a ROUTER that group-commits every ready message (one ``pwritev``
    of all their entries, one ``fdatasync``) and then answers each with its header;
    prints its endpoint first.  With ``formats``, a store's work too (:class:`_Store`).
    Runs until killed."""
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.setsockopt(zmq.SNDHWM, HWM)
    socket.setsockopt(zmq.RCVHWM, HWM)
    socket.bind(LOOPBACK_ANY_PORT)
    journal = _Store(directory) if formats else _RewrittenJournal(directory)
    print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    recv, send = socket.recv_multipart, socket.send_multipart
    while True:
        group = [recv()]
        while True:
            try:
                group.append(recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        journal.commit(group)
        for message in group:
            send(message[:2])
        journal.after_answers()


def _pwritev_all(fd: int, buffers: list, offset: int) -> int:
    """``pwritev`` of ``buffers`` at ``offset``, ``IOV_MAX`` at a time; the new offset."""
    for start in range(0, len(buffers), IOV_MAX):
        offset += os.pwritev(fd, buffers[start:start + IOV_MAX], offset)
    return offset


class _RewrittenJournal:
    """The replication floor's journal: a file of zeros synced beforehand, rewritten from
    its start (its pages stay in the page cache)."""

    def __init__(self, directory: str) -> None:
        self._fd = os.open(os.path.join(directory, "floor-journal.dat"),
                           os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        prepare_zero_fill(self._fd, SYNC_FILE_BYTES)
        self._offset = 0

    def commit(self, group: list[list[bytes]]) -> None:
        """Write the group's entries, one ``fdatasync``."""
        frames = [message[2] for message in group]
        if self._offset + sum(map(len, frames)) > SYNC_FILE_BYTES:
            self._offset = 0
        self._offset = _pwritev_all(self._fd, frames, self._offset)
        os.fdatasync(self._fd)

    def after_answers(self) -> None:
        """Nothing: all of the file was prepared."""


class _Store:
    """The formats' floor's server: each entry's header checked and its journal record
    header made; the journal a new file zero-filled ahead of its records; the entries
    kept for the entry log and the index, which :meth:`_checkpoint` writes."""

    def __init__(self, directory: str) -> None:
        self._journal = os.open(os.path.join(directory, "floor-journal.dat"),
                                os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._offset = self._allocated = 0
        self._zero_fill(ZERO_FILL_STEP)
        self._log = os.open(os.path.join(directory, "floor-entrylog.dat"),
                            os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._log_offset = 0
        self._index = lmdb.open(os.path.join(directory, "floor-index"),
                                map_size=INDEX_MAP_BYTES, max_dbs=1)
        self._entries = self._index.open_db(b"entries")
        self._records: list = []          # record header, entry, record header, entry...
        self._ids: list[int] = []
        self._pending_bytes = 0

    def commit(self, group: list[list[bytes]]) -> None:
        """Journal a group of messages: every entry behind its record header, one
        ``fdatasync``.  A message whose entries name another ledger or ids out of order
        fails the server (the client sends them in order)."""
        records, seed = [], codec.ENTRY_CRC_SEED
        for message in group:
            first, count = BATCH.unpack(message[1])
            body = memoryview(message[2])
            size = len(body) // count
            entries = [body[start:start + size] for start in range(0, len(body), size)]
            ledgers, ids, _ = zip(*map(ENTRY_HEADER.unpack_from, entries))
            if ledgers.count(FORMATS_LEDGER) != count or ids != tuple(
                    range(first, first + count)):
                raise RuntimeError(f"entries {first}+{count}: wrong ledger or ids")
            headers = map(codec.RECORD.pack, itertools.repeat(size),
                          map(crc32c, entries, itertools.repeat(seed)),
                          itertools.repeat(codec.ADD))
            records.extend(itertools.chain.from_iterable(zip(headers, entries)))
            self._ids.extend(ids)
            self._pending_bytes += len(body)
        self._records.extend(records)
        size = sum(map(len, (message[2] for message in group))) \
            + codec.RECORD.size * (len(records) // 2)
        if self._offset + size > STORE_FILE_BYTES:
            self._offset = 0  # the rest of the file is zeros or older records: written
        if self._offset + size > self._allocated:  # behind: this group waits for zeros
            self._zero_fill(self._offset + size - self._allocated)
        self._offset = _pwritev_all(self._journal, records, self._offset)
        os.fdatasync(self._journal)

    def after_answers(self) -> None:
        """Zero-fill a step ahead if the zeros run short; write the entry log and the
        index once enough is journaled."""
        if self._allocated - self._offset < JOURNAL_PREALLOC_BYTES \
                and self._allocated < STORE_FILE_BYTES:
            self._zero_fill(ZERO_FILL_STEP)
        if self._pending_bytes >= ENTRY_LOG_FLUSH_BYTES:
            self._checkpoint()

    def _zero_fill(self, length: int) -> None:
        _pwritev_all(self._journal, [bytes(length)], self._allocated)
        os.fdatasync(self._journal)
        self._allocated += length

    def _checkpoint(self) -> None:
        """Write the kept records into the entry log (one ``fdatasync``) and their
        locations into the index (one synced LMDB transaction)."""
        records, ids = self._records, self._ids
        size = self._pending_bytes + codec.RECORD.size * len(ids)
        if self._log_offset + size > STORE_FILE_BYTES:
            self._log_offset = 0
        first_offset = self._log_offset
        self._log_offset = _pwritev_all(self._log, records, self._log_offset)
        os.fdatasync(self._log)
        record_bytes = codec.RECORD.size + len(records[1])
        offsets = range(first_offset, first_offset + record_bytes * len(ids), record_bytes)
        keys = (entry_id % INDEX_KEYS for entry_id in ids)
        with self._index.begin(write=True) as txn:
            txn.cursor(db=self._entries).putmulti(Index.record_items(
                itertools.repeat(FORMATS_LEDGER), keys, 0, offsets,
                itertools.repeat(len(records[1]))))
        self._records, self._ids, self._pending_bytes = [], [], 0


class FloorClient:
    """One thread sending entries to every server endpoint and counting answers."""

    def __init__(self, endpoints: list[str], ack_quorum: int, payload: bytes,
                 formats: bool = False) -> None:
        self.ack_quorum = ack_quorum
        self.payload = payload
        #: With ``formats``, each entry is encoded as a ledger encodes it (the servers
        #: must then be formats' floor servers, which check its header).
        self.digest = DigestManager(FORMATS_LEDGER, DigestType.CRC32C, b"") \
            if formats else None
        #: Sequence numbers run on across phases, so that a late answer to an entry of
        #: an earlier phase (from the server outside the quorum) is told apart.
        self.next_sequence = 0
        self._context = zmq.Context()
        self.sockets: list[zmq.Socket] = []
        self.poller = zmq.Poller()
        for endpoint in endpoints:
            socket = self._context.socket(zmq.DEALER)
            for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, HWM), (zmq.RCVHWM, HWM)):
                socket.setsockopt(option, value)
            socket.connect(endpoint)
            self.sockets.append(socket)
            self.poller.register(socket, zmq.POLLIN)

    def close(self) -> None:
        for socket in self.sockets:
            socket.close()
        self._context.term()

    def closed_loop(self, window: int, warmup_s: float, seconds: float) -> dict:
        """Full load: keep up to ``window`` entries in flight, sending what the window
        allows as one batch per server.  Latency counts from the send."""
        phase = _Phase(self)
        clock = time.perf_counter_ns
        measure_from = clock() + int(warmup_s * 1e9)
        measure_to = measure_from + int(seconds * 1e9)
        while (now := clock()) < measure_to:
            room = window - phase.in_flight
            if room > 0:
                phase.send([now] * min(room, MAX_BATCH))
            phase.receive(0 if room > window // 2 else RECV_TIMEOUT_S)
        return phase.finish(measure_from, measure_to)

    def open_loop(self, rate_per_s: float, warmup_s: float, seconds: float) -> dict:
        """``rate_per_s`` entries per second on a fixed schedule: at each wake-up, every
        entry that fell due goes out as one batch per server.  Latency counts from each
        entry's scheduled time."""
        phase = _Phase(self)
        clock = time.perf_counter_ns
        interval_ns = 1e9 / rate_per_s
        begin = clock()
        measure_from = begin + int(warmup_s * 1e9)
        measure_to = measure_from + int(seconds * 1e9)
        while (now := clock()) < measure_to:
            due = int((now - begin) / interval_ns) + 1
            if due > phase.sent:
                phase.send([begin + int(number * interval_ns)
                            for number in range(phase.sent, due)])
            wait_ns = begin + int(phase.sent * interval_ns) - clock()
            phase.receive(max(wait_ns / 1e9, TICK_S))
        figures = phase.finish(measure_from, measure_to)
        figures["offered_per_s"] = round(rate_per_s, 1)
        return figures


class _Phase:
    """The entries of one load: their start times, answers so far and acknowledgements."""

    def __init__(self, client: FloorClient) -> None:
        self._client = client
        self._base = client.next_sequence
        self.start_ns: array = array("q")
        self.done_ns: array = array("q")
        self._answers = bytearray()
        self.acknowledged = 0

    @property
    def sent(self) -> int:
        return len(self.start_ns)

    @property
    def in_flight(self) -> int:
        return self.sent - self.acknowledged

    def send(self, start_ns: list[int]) -> None:
        """Send ``len(start_ns)`` entries, one message to every server."""
        count, payload, first = len(start_ns), self._client.payload, self._base + self.sent
        if self._client.digest is None:
            body = payload * count
        else:
            encode, size = self._client.digest.encode, len(payload)
            body = b"".join([encode(number, number - 1, (number + 1) * size, payload)
                             for number in range(first, first + count)])
        message = [BATCH.pack(first, count), body]
        self.start_ns.extend(start_ns)
        self.done_ns.extend([0] * count)
        self._answers.extend(bytes(count))
        self._client.next_sequence += count
        for socket in self._client.sockets:
            socket.send_multipart(message, copy=False)

    def receive(self, timeout_s: float) -> None:
        """Take every answer that arrives within ``timeout_s`` (at least one poll)."""
        ready = self._client.poller.poll(timeout_s * 1000)
        now = time.perf_counter_ns()
        answers, done, quorum = self._answers, self.done_ns, self._client.ack_quorum
        for socket, _ in ready:
            while True:
                try:
                    first, count = BATCH.unpack(socket.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                first -= self._base
                if first < 0:
                    continue  # an earlier phase's entries
                for number in range(first, first + count):
                    answers[number] += 1
                    if answers[number] == quorum:
                        done[number] = now
                        self.acknowledged += 1

    def finish(self, measure_from: int, measure_to: int) -> dict:
        """Wait for every entry's acknowledgement; the figures of those acknowledged in
        ``[measure_from, measure_to)``, and ``entries``, all sent."""
        deadline = time.monotonic() + RECV_TIMEOUT_S
        while self.in_flight:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.in_flight} floor entries never acknowledged")
            self.receive(0.05)
        latencies = [done - start for start, done in zip(self.start_ns, self.done_ns)
                     if measure_from <= done < measure_to]
        figures = latency_summary(latencies, (measure_to - measure_from) / 1e9)
        figures["entries"] = self.sent
        return figures
