"""The ZeroMQ transport's failure handling over real loopback sockets: a bookie that goes
away, comes back, never existed, answers late or wrongly; back-pressure; shutdown;
pipelining from many threads."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import pytest
import zmq
from conftest import KEY, entry
from zmqutil import LOOPBACK, RawDealer, RawRouter

from pybk.errors import BookieUnavailable, EntryTooLarge, LedgerFenced, MalformedMessage, Timeout
from pybk.net import BookieServer, ClientLoop, ZmqBookieClient, wire
from pybk.net import client as client_module
from pybk.settings import ClientSettings
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(60)

#: Time limits far longer than any test step: a prompt failure cannot be a timeout.
PATIENT = ClientSettings(addEntryTimeout=30, readTimeout=30)


def serve_with_read_limit(limit: int, bookie_factory, settings_factory, closing):
    """A bookie holding entry 0 of ledger 1, its server (at most ``limit`` reads in
    progress) and a client of it."""
    bookie = bookie_factory(settings_factory(maxReadsInProgressLimit=limit))
    server = closing.enter_context(BookieServer(bookie, LOOPBACK))
    client = closing.enter_context(ZmqBookieClient("B1", server.address, PATIENT))
    client.add(1, 0, entry(1, 0, lac=-1), KEY).result(timeout=WAIT_S)
    return bookie, server, client


def test_a_closed_server_fails_outstanding_requests_promptly_and_clients_reconnect(
        bookie_factory, settings_factory, closing):
    bookie, server, client = serve_with_read_limit(1, bookie_factory, settings_factory,
                                                   closing)
    # A parked long poll fills the server's read limit: it stops reading, so the
    # requests after it stay outstanding, unread.
    poll = client.read_lac_long_poll(1, -1, 0, timeout_s=30)
    outstanding = [client.read_lac(1) for _ in range(5)]
    time.sleep(0.3)
    assert not poll.done() and not any(f.done() for f in outstanding)

    server.close()
    # The server answers the parked long poll on its way out; the answer races the
    # connection loss on the client (IMMEDIATE drops what it has not read yet), so the
    # poll ends promptly either answered or failed, never left waiting.  Failed as
    # unavailable, not by their time limit (a Timeout): they did not wait for it.
    try:
        assert poll.result(timeout=60) == (-1, None)
    except BookieUnavailable:
        pass
    for future in outstanding:
        assert isinstance(future.exception(timeout=60), BookieUnavailable)
    with pytest.raises(BookieUnavailable):  # and new requests fail at once meanwhile
        client.read_lac(1).result(timeout=60)

    closing.enter_context(BookieServer(bookie, server.address))  # back, same address
    wait_until(lambda: client.read_lac(1).exception(timeout=WAIT_S) is None,
               "the client reaches the bookie")
    assert client.read(1, 0).result(timeout=WAIT_S) == entry(1, 0, lac=-1)


def test_a_bookie_nobody_serves_fails_requests_at_once(closing):
    with RawRouter() as gone:
        address = gone.address  # a port that was free a moment ago and is closed now
    client = closing.enter_context(ZmqBookieClient("B9", address, PATIENT))
    with pytest.raises(BookieUnavailable, match="B9"):  # not PATIENT's Timeout
        client.add(1, 0, entry(1, 0), KEY).result(timeout=60)
    nowhere = closing.enter_context(ZmqBookieClient("B8", "tcp://not an address", PATIENT))
    with pytest.raises(BookieUnavailable, match="cannot connect"):
        nowhere.read_lac(1).result(timeout=WAIT_S)


#: A peer that accepts a connection and never answers; SIGSTOP then silences its ZeroMQ
#: I/O thread too, as a hung or partitioned bookie would be silent.
SILENT_PEER = """
import sys, time, zmq
socket = zmq.Context().socket(zmq.ROUTER)
print(socket.bind_to_random_port("tcp://127.0.0.1"), flush=True)
time.sleep(60)
"""


def test_a_hung_bookie_is_detected_by_heartbeats(closing):
    peer = subprocess.Popen([sys.executable, "-c", SILENT_PEER], stdout=subprocess.PIPE,
                            text=True)
    closing.enter_context(peer)  # on exit: close its pipe, wait for it
    closing.callback(peer.kill)  # runs first (SIGKILL also ends a stopped process)
    address = f"tcp://127.0.0.1:{int(peer.stdout.readline())}"
    client = closing.enter_context(ZmqBookieClient("B1", address, ClientSettings(
        readTimeout=600, zmqHeartbeatIntervalMs=100, zmqHeartbeatTimeoutMs=500)))
    unanswered = client.read_lac(1)
    time.sleep(0.5)  # connected, request delivered, heartbeats answered: still waiting
    assert not unanswered.done()
    os.kill(peer.pid, signal.SIGSTOP)
    # Unavailable by the heartbeats, long before the read's own limit (a Timeout).
    assert isinstance(unanswered.exception(timeout=60), BookieUnavailable)


def test_timeouts_are_per_request_and_late_or_wrong_replies_are_handled(closing):
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient(
        "B1", router.address, ClientSettings(readTimeout=0.3, addEntryTimeout=0.3)))
    late = client.read_lac(1)
    identity, header = router.receive(timeout_s=10)
    with pytest.raises(Timeout, match="READ_LAC"):
        late.result(timeout=WAIT_S)
    first_id = wire.decode_request([header], 1024).request_id

    answered = client.read_lac(2)
    identity, header = router.receive(timeout_s=10)
    second_id = wire.decode_request([header], 1024).request_id
    for request_id, lac in ((first_id, 5), (second_id, 6)):  # the first one is too late
        router.send([identity, *wire.encode_reply(wire.Reply(wire.Op.READ_LAC, request_id,
                                                             lac=lac), 1024)])
    assert answered.result(timeout=WAIT_S) == 6

    wrong_op = client.read_lac(3)
    identity, header = router.receive(timeout_s=10)
    request_id = wire.decode_request([header], 1024).request_id
    router.send([identity, *wire.encode_reply(wire.Reply(wire.Op.DELETE, request_id), 1024)])
    with pytest.raises(MalformedMessage, match="answered a READ_LAC request"):
        wrong_op.result(timeout=WAIT_S)

    garbled = client.read_lac(4)
    identity, header = router.receive(timeout_s=10)
    request_id = wire.decode_request([header], 1024).request_id
    reply = wire.encode_reply(wire.Reply(wire.Op.READ_LAC, request_id), 1024)[0]
    router.send([identity, reply + b"trailing bytes"])
    with pytest.raises(MalformedMessage):
        garbled.result(timeout=WAIT_S)


def test_a_server_at_its_read_limit_stops_reading_until_reads_finish(
        bookie_factory, settings_factory, closing):
    bookie, _, client = serve_with_read_limit(2, bookie_factory, settings_factory, closing)
    polls = [client.read_lac_long_poll(1, -1, 0, timeout_s=30) for _ in range(2)]
    behind = client.read_lac(1)
    time.sleep(0.3)
    assert not behind.done() and not any(p.done() for p in polls)
    bookie.add_entry(1, 1, entry(1, 1, lac=0), KEY)  # the LAC moves: the polls end
    assert [p.result(timeout=WAIT_S) for p in polls] == [(0, entry(1, 0, lac=-1))] * 2
    assert behind.result(timeout=WAIT_S) == 0


def flood_unread(hog: RawDealer, count: int) -> None:
    """Reads of ledger 1's entry 0 from ``hog``, which never reads the replies (each
    send waits at most 10 s)."""
    hog.socket.setsockopt(zmq.SNDTIMEO, 10_000)
    for request_id in range(count):
        hog.send(wire.encode_request(wire.Request(wire.Op.READ, request_id, ledger_id=1,
                                                  entry_id=0), 1 << 20))


#: More 16 KiB replies than ZeroMQ's queue to a client (1000 messages) and TCP hold.
UNREAD_REPLIES = 4000


def test_a_client_that_does_not_read_its_replies_stalls_no_one(bookie, closing):
    """Replies ZeroMQ cannot take for a client that does not read them wait in the
    server, which reads on: that client's requests and everybody else's are served."""
    bookie.add_entry(1, 0, entry(1, 0, body=b"x" * 16384, lac=-1), KEY)
    server = closing.enter_context(BookieServer(bookie, LOOPBACK))
    hog = closing.enter_context(RawDealer(server.address, receive_hwm=1))
    flood_unread(hog, UNREAD_REPLIES)
    wait_until(lambda: server.requests_served()["read"] == UNREAD_REPLIES,
               "the server read every request of a client that does not read replies",
               timeout_s=20)
    client = closing.enter_context(ZmqBookieClient("B1", server.address, PATIENT))
    assert client.read_lac(1).result(timeout=WAIT_S) == -1


def test_a_closing_server_lets_a_vanished_clients_replies_go(
        bookie_factory, settings_factory, closing, caplog):
    """A client vanished with requests the server had not read and replies it could not
    take: ZeroMQ refuses those replies until the server has read the requests, so the
    closing server reads (and drops) them, and the close does not wait out its time
    limit for the replies."""
    bookie = bookie_factory(settings_factory(maxReadsInProgressLimit=1))
    bookie.add_entry(1, 0, entry(1, 0, body=b"x" * 16384, lac=-1), KEY)
    server = BookieServer(bookie, LOOPBACK)
    closing.callback(server.close)
    hog = closing.enter_context(RawDealer(server.address, receive_hwm=1))
    flood_unread(hog, UNREAD_REPLIES)
    wait_until(lambda: server.requests_served()["read"] == UNREAD_REPLIES,
               "the server read every request of a client that does not read replies",
               timeout_s=20)
    client = closing.enter_context(ZmqBookieClient("B1", server.address, PATIENT))
    poll = client.read_lac_long_poll(1, -1, 0, timeout_s=30)  # the server stops reading
    wait_until(lambda: server.requests_served()["long_poll"] == 1, "the poll is parked")
    flood_unread(hog, 10)  # not read
    hog.close()  # reset: replies it did not read are waiting in its TCP buffer
    with caplog.at_level(logging.WARNING, logger="pybk.net.server"):
        server.close()
    assert poll.result(timeout=WAIT_S) == (-1, None)
    assert "closing with" not in caplog.text  # the warning of a close out of time


def test_many_threads_pipeline_through_clients_sharing_one_loop(bookie_factory,
                                                                settings_factory, tmp_path,
                                                                closing):
    servers = [closing.enter_context(BookieServer(bookie_factory(settings_factory(
        journalDirectory=str(tmp_path / f"journal{i}"),
        ledgerDirectories=(str(tmp_path / f"ledgers{i}"),))), LOOPBACK)) for i in range(2)]
    loop = closing.enter_context(ClientLoop())
    clients = [ZmqBookieClient(f"B{i}", s.address, PATIENT, loop=loop)
               for i, s in enumerate(servers)]
    errors: list[BaseException] = []

    def write(ledger_id: int) -> None:
        try:
            for client in clients:
                futures = [client.add(ledger_id, e, entry(ledger_id, e), KEY)
                           for e in range(300)]
                assert [f.result(timeout=30) for f in futures] == [None] * 300
                reads = [client.read(ledger_id, e) for e in range(300)]
                assert [f.result(timeout=30) for f in reads] == \
                    [entry(ledger_id, e) for e in range(300)]
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=write, args=(ledger_id,)) for ledger_id in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors


def test_closing_a_client_fails_what_is_outstanding_and_what_comes_after(
        bookie_factory, closing):
    server = closing.enter_context(BookieServer(bookie_factory(), LOOPBACK))
    client = closing.enter_context(ZmqBookieClient("B1", server.address, PATIENT))
    client.add(1, 0, entry(1, 0, lac=-1), KEY).result(timeout=WAIT_S)
    poll = client.read_lac_long_poll(1, -1, 0, timeout_s=30)
    time.sleep(0.1)
    client.close()
    assert isinstance(poll.exception(timeout=WAIT_S), BookieUnavailable)
    assert isinstance(client.read_lac(1).exception(timeout=WAIT_S), BookieUnavailable)


def test_adds_gather_while_the_bookies_answers_are_outstanding(closing):
    """With zmqAddMessagesInFlight=1, the first add leaves alone; those made before its
    answer wait, then leave together in one ADD message; each gets its own status."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient(
        "B1", router.address, ClientSettings(addEntryTimeout=30, zmqAddMessagesInFlight=1)))

    def next_add_message():
        identity, header, body = router.receive(timeout_s=10)
        request = wire.decode_request([header, body], 1024 * 1024)
        return identity, request.request_id, wire.decode_adds(request.entry, 1024 * 1024)

    def answer(identity, request_id, statuses, message=""):
        router.send([identity, *wire.encode_reply(wire.Reply(
            wire.Op.ADD, request_id, message=message,
            body=wire.encode_add_statuses(statuses)), 1024 * 1024)])

    first = client.add(5, 0, entry(5, 0), KEY)
    identity, first_id, runs = next_add_message()
    assert runs == [wire.AddRun(5, [0], [entry(5, 0)], KEY)]
    waiting = [client.add(5, e, entry(5, e), KEY) for e in range(1, 51)]
    waiting.append(client.add(6, 0, entry(6, 0), b"other key", recovery=True))
    assert router.receive(timeout_s=0.3) is None  # held in the client meanwhile
    answer(identity, first_id, [0])
    assert first.result(timeout=WAIT_S) is None
    identity, second_id, runs = next_add_message()
    assert runs == [wire.AddRun(5, list(range(1, 51)), [entry(5, e) for e in range(1, 51)],
                                KEY),
                    wire.AddRun(6, [0], [entry(6, 0)], b"other key", True)]
    statuses = [0] * 51
    statuses[50] = wire.error_code(LedgerFenced("ledger 6 is fenced"))
    answer(identity, second_id, statuses, "LedgerFenced: ledger 6 is fenced")
    assert [f.result(timeout=WAIT_S) for f in waiting[:50]] == [None] * 50
    with pytest.raises(LedgerFenced, match="bookie B1: LedgerFenced: ledger 6 is fenced"):
        waiting[50].result(timeout=WAIT_S)


def add_message(router):
    """The next ADD message the raw bookie reads: (identity, request id, runs)."""
    identity, header, body = router.receive(timeout_s=10)
    request = wire.decode_request([header, body], 1024 * 1024)
    return identity, request.request_id, wire.decode_adds(request.entry, 1024 * 1024)


def answer_adds(router, identity, request_id, count):
    router.send([identity, *wire.encode_reply(wire.Reply(
        wire.Op.ADD, request_id, body=wire.encode_add_statuses([0] * count)), 1024 * 1024)])


def test_an_add_on_an_idle_connection_leaves_from_the_calling_thread(closing):
    """The caller's thread writes the ADD message itself: it reaches the bookie while
    the loop's thread is busy; the answer is handled once the loop is free again."""
    router = closing.enter_context(RawRouter())
    loop = closing.enter_context(ClientLoop())
    client = closing.enter_context(ZmqBookieClient("B1", router.address, PATIENT,
                                                   loop=loop))
    first = client.add(5, 0, entry(5, 0), KEY)  # connects (sent by the loop or not)
    identity, request_id, _ = add_message(router)
    answer_adds(router, identity, request_id, 1)
    assert first.result(timeout=WAIT_S) is None

    busy, release = threading.Event(), threading.Event()
    closing.callback(release.set)  # the loop is freed even if the test fails
    loop.post(lambda: (busy.set(), release.wait(30)))
    assert busy.wait(10)
    second = client.add(5, 1, entry(5, 1), KEY)
    identity, request_id, runs = add_message(router)  # while the loop is held
    assert runs == [wire.AddRun(5, [1], [entry(5, 1)], KEY)]
    answer_adds(router, identity, request_id, 1)
    time.sleep(0.2)
    assert not second.done()  # replies are the loop's
    release.set()
    assert second.result(timeout=WAIT_S) is None


def test_an_unanswered_add_sent_by_the_caller_times_out_on_time(closing, monkeypatch):
    """The deadline of an add the caller's thread sent wakes the loop when it is due
    before the loop would wake anyway (here: its idle sleep made long)."""
    monkeypatch.setattr(client_module, "_MAX_SLEEP_MS", 600_000)
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient(
        "B1", router.address, ClientSettings(addEntryTimeout=0.5)))
    first = client.add(5, 0, entry(5, 0), KEY)
    identity, request_id, _ = add_message(router)
    answer_adds(router, identity, request_id, 1)
    assert first.result(timeout=WAIT_S) is None
    time.sleep(0.3)  # the loop is asleep, with nothing to time
    unanswered = client.add(5, 1, entry(5, 1), KEY)
    add_message(router)
    # Its deadline ends it, not the loop's idle sleep, which would outlast this wait.
    assert isinstance(unanswered.exception(timeout=120), Timeout)


class NotIterable(deque):
    """An add queue that fails if iterated: other threads append to it while the loop
    takes from it, and an append between making an iterator and using it fails the
    iterator ("deque mutated during iteration"), which once stopped a client's loop."""

    def __iter__(self):
        raise AssertionError("the add queue was iterated")


def test_queued_adds_are_cut_into_messages_within_the_body_limit(closing):
    """Adds that do not fit one ADD body wait for the next message, in order; the loop
    takes them from the queue without iterating it."""
    router = closing.enter_context(RawRouter())
    settings = ClientSettings(addEntryTimeout=30, zmqAddMessagesInFlight=1,
                              maxEntrySizeBytes=4096)
    client = closing.enter_context(ZmqBookieClient("B1", router.address, settings))
    client._connection.adds = NotIterable()
    limit = wire.max_add_body_bytes(4096)
    futures = [client.add(5, 0, entry(5, 0), KEY)]
    received = []
    messages = 0
    while len(received) < 11:
        identity, header, body = router.receive(timeout_s=10)
        messages += 1
        assert len(body) <= limit
        request = wire.decode_request([header, body], 4096)
        runs = wire.decode_adds(request.entry, 4096)
        if not received:  # the first add is out: queue the rest meanwhile
            futures += [client.add(5, e, entry(5, e, body=bytes(1000)), KEY)
                        for e in range(1, 11)]
            time.sleep(0.2)
        received += [(run.ledger_id, e) for run in runs for e in run.entry_ids]
        router.send([identity, *wire.encode_reply(wire.Reply(
            wire.Op.ADD, request.request_id,
            body=wire.encode_add_statuses([0] * sum(len(r.entry_ids) for r in runs))),
            4096)])
    assert received == [(5, e) for e in range(11)]
    assert messages >= 1 + 3  # ten entries of over 1 KB need three 5 KB bodies at least
    assert [f.result(timeout=WAIT_S) for f in futures] == [None] * 11


def test_grouped_adds_are_reported_once_per_run_of_adds_sharing_a_sink(closing):
    """add_grouped: one sink call per run of an ADD message's adds with the same sink,
    with their tokens in order and, when any add failed, an outcome per token."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient(
        "B1", router.address, ClientSettings(addEntryTimeout=30, zmqAddMessagesInFlight=1)))
    calls = []
    four_calls = threading.Event()

    def sink_named(name):
        def sink(tokens, errors):
            calls.append((name, list(tokens), errors and [type(e) for e in errors]))
            if len(calls) == 4:
                four_calls.set()
        return sink

    a, b = sink_named("A"), sink_named("B")
    client.add_grouped(5, 0, entry(5, 0), KEY, "t0", a)
    identity, header, body = router.receive(timeout_s=10)
    first = wire.decode_request([header, body], 1024 * 1024)
    for ledger_id, entry_id, token, sink in [(5, 1, "t1", a), (5, 2, "t2", a),
                                             (6, 0, "t3", b), (5, 3, "t4", a)]:
        client.add_grouped(ledger_id, entry_id, entry(ledger_id, entry_id), KEY, token,
                           sink)
    router.send([identity, *wire.encode_reply(wire.Reply(
        wire.Op.ADD, first.request_id, body=wire.encode_add_statuses([0])), 1024 * 1024)])
    identity, header, body = router.receive(timeout_s=10)
    second = wire.decode_request([header, body], 1024 * 1024)
    assert [run.entry_ids for run in wire.decode_adds(second.entry, 1024 * 1024)] == \
        [[1, 2], [0], [3]]  # one message, in three runs
    statuses = [0, wire.error_code(LedgerFenced("fenced")), 0, 0]
    router.send([identity, *wire.encode_reply(wire.Reply(
        wire.Op.ADD, second.request_id, message="LedgerFenced: fenced",
        body=wire.encode_add_statuses(statuses)), 1024 * 1024)])
    assert four_calls.wait(10)
    assert calls == [("A", ["t0"], None), ("A", ["t1", "t2"], [type(None), LedgerFenced]),
                     ("B", ["t3"], [type(None)]), ("A", ["t4"], [type(None)])]


def test_an_entry_over_the_maximum_fails_alone(bookie_factory, settings_factory, closing):
    bookie = bookie_factory(settings_factory())
    server = closing.enter_context(BookieServer(bookie, LOOPBACK))
    settings = ClientSettings(addEntryTimeout=30, maxEntrySizeBytes=4096)
    client = closing.enter_context(ZmqBookieClient("B1", server.address, settings))
    adds = [client.add(3, e, entry(3, e), KEY) for e in range(3)]
    too_large = client.add(4, 0, entry(4, 0, body=bytes(4096)), KEY)
    adds += [client.add(3, e, entry(3, e), KEY) for e in range(3, 6)]
    with pytest.raises(EntryTooLarge):
        too_large.result(timeout=WAIT_S)
    assert [f.result(timeout=WAIT_S) for f in adds] == [None] * 6
    assert bookie.entry_ids(3) == list(range(6))


@pytest.mark.parametrize("entries", [2, 12], ids=["small body", "large body"])
def test_a_server_keeps_a_large_add_body_as_it_arrived(bookie, closing, entries):
    """An ADD body over libzmq's 8 KiB receive arena reaches the write cache as views of
    its ZeroMQ message (no copy); a smaller one, which may share an arena, is copied."""
    server = closing.enter_context(BookieServer(bookie, LOOPBACK))
    dealer = closing.enter_context(RawDealer(server.address))
    run = wire.AddRun(5, list(range(entries)), [entry(5, e, body=bytes(1000))
                                                for e in range(entries)], KEY)
    dealer.send(wire.encode_add_request(7, [run], 1024 * 1024))
    reply = dealer.receive(10)
    assert reply is not None
    assert wire.decode_add_statuses(wire.decode_reply(reply, 1024 * 1024).required_body(),
                                    entries) is None
    held = [bookie._active.get(5, e) for e in range(entries)]
    assert held == run.entries
    large = len(wire.encode_adds([run], 1024 * 1024)) > 8192
    assert large == (entries == 12)
    kept_in = zmq.Frame if large else bytes  # the ZeroMQ message itself, or a copy
    assert all(isinstance(h, memoryview) and isinstance(h.obj, kept_in) for h in held)
    assert [bookie.read_entry(5, e) for e in range(entries)] == run.entries


def connected_to_router(closing) -> tuple[RawRouter, ZmqBookieClient]:
    """A ROUTER playing a bookie, and a client of it whose connection is up (its first
    request, which waits for the connection, answered)."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient("B1", router.address, PATIENT))
    client.read_lac(1)
    identity, header = router.receive(timeout_s=10)
    router.send([identity, *wire.encode_reply(wire.Reply(
        wire.Op.READ_LAC, wire.decode_request([header], 1024).request_id), 1024)])
    wait_until(lambda: not client._connection.calls, "the first request answered")
    return router, client


def test_a_callers_requests_leave_in_order_whether_it_sends_them_or_the_loop_does(closing):
    """A caller sends its request itself when the connection's socket is free; while
    another thread uses it, the request waits for the loop, and the caller's next
    requests wait behind it rather than overtake it once the socket is free again."""
    router, client = connected_to_router(closing)
    connection = client._connection
    held, release = threading.Event(), threading.Event()

    def hold_socket() -> None:  # another thread using the socket
        with connection.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_socket)
    holder.start()
    try:
        assert held.wait(10)
        client.read_lac(2)  # the socket is taken: left to the loop
        assert connection.calls, "a request sent while another thread held the socket"
    finally:
        release.set()
        holder.join(10)
    for ledger_id in range(3, 8):  # socket free again, maybe before the loop sent 2
        client.read_lac(ledger_id)
    ledgers = []
    for _ in range(6):
        message = router.receive(timeout_s=10)
        assert message is not None, f"requests received: {ledgers}"
        ledgers.append(wire.decode_request(message[1:], 1024).ledger_id)
    assert ledgers == list(range(2, 8))


def test_a_ledger_sender_queues_runs_and_refuses_once_the_connection_is_down(closing):
    """ledger_adds: each send is one add of that ledger, key and sink (sent as runs of
    one ADD message); once the bookie went away, send queues nothing and says so, so
    that the ledger asks for the bookie's client again."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient(
        "B1", router.address, ClientSettings(addEntryTimeout=30, zmqAddMessagesInFlight=1)))
    reported = []
    done = threading.Event()

    def sink(tokens, errors):
        reported.append((list(tokens), errors))
        done.set()

    send = client.ledger_adds(9, KEY, sink)
    assert send(0, entry(9, 0), "t0")
    identity, header, body = router.receive(timeout_s=10)
    first = wire.decode_request([header, body], 1024 * 1024)
    assert send(1, entry(9, 1), "t1") and send(2, entry(9, 2), "t2")
    router.send([identity, *wire.encode_reply(wire.Reply(
        wire.Op.ADD, first.request_id, body=wire.encode_add_statuses([0])), 1024 * 1024)])
    identity, header, body = router.receive(timeout_s=10)
    second = wire.decode_request([header, body], 1024 * 1024)
    assert wire.decode_adds(second.entry, 1024 * 1024) == [
        wire.AddRun(9, [1, 2], [entry(9, 1), entry(9, 2)], KEY, False)]
    assert reported == [(["t0"], None)]

    router.close()  # the bookie goes away: the outstanding message fails
    wait_until(lambda: client.is_down, "the client sees the bookie down")
    assert not send(3, entry(9, 3), "t3")
    wait_until(lambda: len(reported) == 2, "both failures reported")
    assert reported[1][0] == ["t1", "t2"]
    assert [type(e) for e in reported[1][1]] == [BookieUnavailable] * 2


def test_every_add_after_a_client_closed_fails_at_once(closing):
    """Adds made after the client (and its own loop) closed each fail at once with
    BookieUnavailable: the first failing does not leave the next ones waiting for a loop
    that is gone."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient("B1", router.address, PATIENT))
    client.close()
    for entry_id in range(3):
        error = client.add(5, entry_id, entry(5, entry_id), KEY).exception(timeout=WAIT_S)
        assert isinstance(error, BookieUnavailable), f"add {entry_id}: {error!r}"


def test_a_reply_received_in_the_round_its_deadline_passes_still_counts(closing):
    """A reply the loop reads in the same round as its request's deadline passes settles
    the request (it came before the loop looked at the deadline): the loop handles the
    replies it read before it expires requests, not after."""
    router = closing.enter_context(RawRouter())
    loop = closing.enter_context(ClientLoop())
    client = closing.enter_context(ZmqBookieClient(
        "B1", router.address, ClientSettings(addEntryTimeout=30, readTimeout=0.3),
        loop=loop))

    def answer_lac(lac: int) -> None:
        message = router.receive(timeout_s=10)
        assert message is not None
        identity, header = message
        router.send([identity, *wire.encode_reply(wire.Reply(
            wire.Op.READ_LAC, wire.decode_request([header], 1024).request_id, lac=lac),
            1024)])

    first = client.read_lac(1)  # waits for the connection: then it is up
    answer_lac(4)
    assert first.result(timeout=WAIT_S) == 4
    busy, release = threading.Event(), threading.Event()
    closing.callback(release.set)  # the loop is freed even if the test fails
    loop.post(lambda: (busy.set(), release.wait(30)))
    assert busy.wait(10)
    answered = client.read_lac(1)  # sent by this thread: the loop times it next round
    answer_lac(7)  # received by ZeroMQ at once; read by the loop when it is free
    time.sleep(0.6)  # past the deadline, while the loop is held
    release.set()
    assert answered.result(timeout=WAIT_S) == 7


def test_a_force_leaves_after_the_adds_queued_before_it(closing):
    """A FORCE_LEDGER reaches the bookie after every add the client queued for it
    earlier.  Adds wait in the client while ``zmqAddMessagesInFlight`` ADD messages are
    out; a force that overtook them would find the bookie without them, and the ledger
    client would count that bookie as short of entries it was about to store."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient("B1", router.address, ClientSettings(
        addEntryTimeout=30, readTimeout=30, zmqAddMessagesInFlight=1)))
    first = client.add(1, 0, entry(1, 0), KEY)
    identity, *frames = router.receive(timeout_s=10)
    held = wire.decode_request(frames, 1024)  # the one ADD out, unanswered for now
    second = client.add(1, 1, entry(1, 1), KEY)  # waits in the client for that answer
    forced = client.force_ledger(1, 0, 1)
    router.send([identity, *wire.encode_adds_durable(held.request_id, 1)])
    arrived = []
    for _ in range(2):
        identity, *frames = router.receive(timeout_s=10)
        request = wire.decode_request(frames, 1024)
        arrived.append((request.op, request.request_id, request.entry and
                        [run.entry_ids for run in wire.decode_adds(request.entry, 1024)]))
    assert [(op, ids) for op, _, ids in arrived] == [(wire.Op.ADD, [[1]]),
                                                     (wire.Op.FORCE_LEDGER, None)]
    (_, add_id, _), (_, force_id, _) = arrived
    router.send([identity, *wire.encode_adds_durable(add_id, 1)])
    router.send([identity, *wire.encode_reply(wire.Reply(wire.Op.FORCE_LEDGER, force_id,
                                                         lac=2), 1024)])
    assert (first.result(timeout=WAIT_S), second.result(timeout=WAIT_S)) == (None, None)
    assert forced.result(timeout=WAIT_S) == 2


def test_a_request_made_after_a_force_does_not_overtake_it(closing):
    """A caller's requests leave in the order made, a FORCE_LEDGER or an explicit LAC
    (which wait for the adds queued before them) included: a READ_LAC made after a
    WRITE_LAC must not reach the bookie first and read the LAC of before."""
    router = closing.enter_context(RawRouter())
    loop = closing.enter_context(ClientLoop())
    client = closing.enter_context(ZmqBookieClient("B1", router.address, PATIENT,
                                                   loop=loop))
    client.read_lac(1)  # the first request waits for the connection: then it is up
    identity, header = router.receive(timeout_s=10)
    router.send([identity, *wire.encode_reply(wire.Reply(
        wire.Op.READ_LAC, wire.decode_request([header], 1024).request_id), 1024)])
    wait_until(lambda: not client._connection.calls, "the first request answered")
    busy, release = threading.Event(), threading.Event()
    closing.callback(release.set)  # the loop is freed even if the test fails
    loop.post(lambda: (busy.set(), release.wait(30)))
    assert busy.wait(10)
    client.write_lac(1, 5, KEY)
    client.force_ledger(1, 0, 5)
    client.read_lac(1)  # the socket is free: this thread may send it itself
    release.set()
    ops = []
    for _ in range(3):
        message = router.receive(timeout_s=10)
        assert message is not None, f"requests received: {ops}"
        ops.append(wire.decode_request(message[1:], 1024).op)
    assert ops == [wire.Op.WRITE_LAC, wire.Op.FORCE_LEDGER, wire.Op.READ_LAC]


def test_an_add_kept_for_the_next_one_fails_when_the_connection_refuses_that_one(closing):
    """An add sent with ``more=True`` waits in the client for the caller's next add; if
    the connection goes down meanwhile, that next send is refused (the caller asks for
    the bookie's client again, which may be another connection), and the kept add fails
    then too rather than waiting, unanswered, in a connection nobody adds to."""
    router = closing.enter_context(RawRouter())
    client = closing.enter_context(ZmqBookieClient("B1", router.address, PATIENT))
    reported = []

    def sink(tokens, errors):
        reported.append((list(tokens), errors))

    send = client.ledger_adds(9, KEY, sink, recovery=True)
    assert send(0, entry(9, 0), "t0")
    identity, request_id, _ = add_message(router)
    answer_adds(router, identity, request_id, 1)
    wait_until(lambda: reported == [(["t0"], None)], "the first add answered")
    assert send(1, entry(9, 1), "kept", more=True)
    router.close()  # the bookie goes away before the caller's next add
    wait_until(lambda: client.is_down, "the client sees the bookie down")
    assert not send(2, entry(9, 2), "t2")
    wait_until(lambda: len(reported) == 2, "the kept add answered", timeout_s=10)
    assert reported[1][0] == ["kept"]
    assert [type(e) for e in reported[1][1]] == [BookieUnavailable]


def test_a_force_made_while_a_group_is_kept_leaves_after_the_group(closing):
    """A FORCE_LEDGER of another ledger made while a caller keeps adds for its next one
    (``more=True``) is held behind them, and leaves right after them once the caller's
    last add sends the group: the kept adds delay it only until then."""
    router, client = connected_to_router(closing)
    send = client.ledger_adds(9, KEY, lambda tokens, errors: None, recovery=True)
    assert send(0, entry(9, 0), 0, more=True) and send(1, entry(9, 1), 1, more=True)
    forced = client.force_ledger(2, 0, 0)
    assert router.receive(timeout_s=0.3) is None  # held behind the kept adds
    assert send(2, entry(9, 2), 2)
    identity, request_id, runs = add_message(router)
    assert [run.entry_ids for run in runs] == [[0, 1, 2]]
    identity, *frames = router.receive(timeout_s=10)
    force = wire.decode_request(frames, 1024)
    assert force.op == wire.Op.FORCE_LEDGER
    router.send([identity, *wire.encode_reply(wire.Reply(wire.Op.FORCE_LEDGER,
                                                         force.request_id, lac=0), 1024)])
    assert forced.result(timeout=WAIT_S) == 0
