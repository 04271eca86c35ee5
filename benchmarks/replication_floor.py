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
"""

from __future__ import annotations

import os
import struct
import time
from array import array

import zmq
from rawdisk import latency_summary, prepare_zero_fill

LOOPBACK_ANY_PORT = "tcp://127.0.0.1:*"
HWM = 100_000                       # high-water marks well above any window
SYNC_FILE_BYTES = 64 * 1024 * 1024  # each server's file of zeros, rewritten from its start
MAX_BATCH = 1000                    # entries in one message at most (pybk's batches are smaller)
#: A message's header and its answer: the first entry's sequence number, the entries.
BATCH = struct.Struct(">QI")
RECV_TIMEOUT_S = 10.0               # no answer for this long fails the run
#: An open-loop client wakes at least this often, then sends every entry that fell due
#: (as ``cluster_bench``'s open-loop producer does for pybk).
TICK_S = 0.001


def serve_durable_group_echo(directory: str) -> None:
    """Child process: a ROUTER that group-commits every ready message (one ``pwritev``
    of all their entries, one ``fdatasync``) and then answers each with its header;
    prints its endpoint first.  Runs until killed."""
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.setsockopt(zmq.SNDHWM, HWM)
    socket.setsockopt(zmq.RCVHWM, HWM)
    socket.bind(LOOPBACK_ANY_PORT)
    fd = os.open(os.path.join(directory, "floor-journal.dat"),
                 os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    prepare_zero_fill(fd, SYNC_FILE_BYTES)
    print(socket.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    recv, send, offset = socket.recv_multipart, socket.send_multipart, 0
    iov_max = os.sysconf("SC_IOV_MAX")
    while True:
        group = [recv()]
        while True:
            try:
                group.append(recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        frames = [message[2] for message in group]
        size = sum(map(len, frames))
        if offset + size > SYNC_FILE_BYTES:
            offset = 0
        for start in range(0, len(frames), iov_max):
            offset += os.pwritev(fd, frames[start:start + iov_max], offset)
        os.fdatasync(fd)
        for message in group:
            send(message[:2])


class FloorClient:
    """One thread sending entries to every server endpoint and counting answers."""

    def __init__(self, endpoints: list[str], ack_quorum: int, payload: bytes) -> None:
        self.ack_quorum = ack_quorum
        self.payload = payload
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
        count = len(start_ns)
        message = [BATCH.pack(self._base + self.sent, count), self._client.payload * count]
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
