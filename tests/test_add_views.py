"""What a bookie holds when it keeps ADD entries as views of the message they came in:
never more than it counts (its write cache's bound), never a message for the sake of
adds that wait."""

from __future__ import annotations

import gc
import threading
from concurrent.futures import Future

import pytest
from conftest import KEY, entry
from zmqutil import LOOPBACK, RawDealer

from pybk.errors import NoSuchLedger
from pybk.net import BookieServer, wire
from pybk.net import frames as frames_module
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(60)

LIMIT = 1024 * 1024


def held_bytes(bookie) -> int:
    """The bytes the write cache keeps alive: each distinct object its views are views
    of, whole, and its bytes entries."""
    cache = bookie._active
    objects = {}
    total = 0
    for held in cache._entries:
        if isinstance(held, memoryview):
            objects[id(held.obj)] = held.obj
        else:
            total += len(held)
    return total + sum(map(len, objects.values()))


def test_a_message_of_long_keys_and_short_entries_is_not_held_for_its_entries(bookie):
    """Each run of an ADD carries its master key (up to 1 KiB) and each add 12 bytes of
    id and length: a message of many runs with one short entry each is mostly not
    entries.  Kept as views, the write cache would hold the whole message while counting
    only the entries (40 times less), so a client could hold 40 times the cache's bound
    in memory."""
    key = b"k" * wire.MAX_MASTER_KEY_BYTES
    runs = [(ledger_id, [0], [entry(ledger_id, 0, body=b"")], key, False)
            for ledger_id in range(1, 41)]
    body = wire.encode_adds(runs, LIMIT)
    done = threading.Event()
    bookie.add_entries_async(wire.decode_adds(body, LIMIT), lambda errors: done.set())
    assert done.wait(10)
    assert bookie._active.size_bytes == sum(len(r[2][0]) for r in runs)
    assert held_bytes(bookie) <= 2 * bookie._active.size_bytes
    assert [bookie.read_entry(r[0], 0) for r in runs] == [r[2][0] for r in runs]


def test_a_message_with_adds_waiting_for_the_guard_is_not_held_by_the_server(
        bookie, closing, monkeypatch):
    """Adds waiting for the guard's check of their ledger are copied so that they do not
    hold their message (at most ADDS_AWAITING_ADMISSION_MAX adds wait, and a server does
    not count them among its adds in progress): nothing else may hold it either, or a
    client sending large messages each with one such add holds that many messages."""
    received: list[bytearray] = []
    plain = frames_module.recv_message

    def recv_into_our_buffers(socket, view_min_bytes=None):
        # Each view frame as a view of a buffer of ours, whose exports tell whether
        # anything still holds a view of it.
        message = plain(socket, view_min_bytes)
        for i, frame in enumerate(message):
            if isinstance(frame, memoryview):
                received.append(bytearray(frame))
                message[i] = memoryview(received[-1]).toreadonly()
        return message

    monkeypatch.setattr(frames_module, "recv_message", recv_into_our_buffers)
    bookie.add_entry(5, 0, entry(5, 0), KEY)  # a ledger the bookie knows
    checks: list[Future] = []

    def stalled_check(ledger_id: int) -> Future:
        checks.append(Future())
        return checks[-1]

    bookie.guard_unknown_ledgers(stalled_check, ledger_id_floor=100)
    server = closing.enter_context(BookieServer(bookie, LOOPBACK))
    dealer = closing.enter_context(RawDealer(server.address))
    good = wire.AddRun(5, list(range(1, 41)), [entry(5, e, body=bytes(1000))
                                               for e in range(1, 41)], KEY)
    waiting = wire.AddRun(3, [0], [entry(3, 0)], KEY)  # unknown, under the floor
    dealer.send(wire.encode_add_request(7, [good, waiting], LIMIT))
    try:
        wait_until(lambda: checks and bookie._active.get(5, 40) is not None,
                   "the good adds cached and the guard asked")
        bookie.force(5).result(timeout=WAIT_S)  # the good adds are written and synced
        assert len(received) == 1
        gc.collect()
        try:
            received[0].append(0)  # refused while a view of the message is alive
        except BufferError:
            pytest.fail("a view of the message is held while its adds wait for the guard")
    finally:
        for check in checks:
            check.set_exception(NoSuchLedger("ledger 3 is not in the metadata"))
    reply = dealer.receive(10)
    assert reply is not None
    statuses = wire.decode_add_statuses(
        wire.decode_reply(reply, LIMIT).required_body(), 41)
    assert statuses is not None and statuses[:40] == [0] * 40 and statuses[40] != 0


def test_deleting_a_ledger_leaves_no_message_held_beyond_what_the_cache_counts(
        bookie_factory):
    """A message's views of a ledger that is deleted leave the cache; views of other
    ledgers' entries in the same message still keep it whole: the cache must go on
    counting it (until the checkpoint lets go), or a client sending a large entry of a
    ledger it deletes with a short entry of another holds messages the cache's bound
    does not see."""
    bookie = bookie_factory(start_background_threads=False)  # no checkpoint meanwhile
    runs = [(1, list(range(40)), [entry(1, e, body=bytes(1000)) for e in range(40)], KEY,
             False), (2, [0], [entry(2, 0)], KEY, False)]
    done = threading.Event()
    bookie.add_entries_async(wire.decode_adds(wire.encode_adds(runs, LIMIT), LIMIT),
                             lambda errors: done.set())
    assert done.wait(10)
    bookie.delete_ledger(1)
    assert bookie.read_entry(2, 0) == entry(2, 0)
    assert held_bytes(bookie) <= 2 * bookie._active.size_bytes


@pytest.mark.timeout(300)
def test_a_torn_message_of_new_ledgers_never_leaves_an_entry_without_its_key(
        tmp_path, settings_factory):
    """One ADD message creating three ledgers, its entries views of the body: the keys
    are journaled first, then the adds, in one write.  Cut at every byte of that write,
    the restarted bookie holds exactly the records before the cut: each entry it holds
    with its bytes and its ledger's key, and no entry whose key record was cut."""
    from crashutil import files, restore_image, take_image

    from pybk.errors import NoSuchEntry, Unauthorized
    from pybk.storage import Bookie, format_bookie, make_entry
    from pybk.storage import journal_codec as codec

    settings = settings_factory(flushInterval=3_600_000)
    format_bookie(settings)
    keys = {1: b"one", 2: b"two", 3: b"three"}
    entries = {(1, 0): make_entry(1, 0, -1, b"a"), (1, 1): make_entry(1, 1, 0, b"bb"),
               (2, 0): make_entry(2, 0, -1, b"ccc"), (3, 0): make_entry(3, 0, -1, b"")}
    runs = [(ledger_id, [e for (lid, e) in entries if lid == ledger_id],
             [data for (lid, _e), data in entries.items() if lid == ledger_id],
             keys[ledger_id], False) for ledger_id in keys]
    with Bookie(settings) as bookie:
        outcomes: list = []
        done = threading.Event()
        bookie.add_entries_async(wire.decode_adds(wire.encode_adds(runs, LIMIT), LIMIT),
                                 lambda errors: (outcomes.append(errors), done.set()))
        assert done.wait(10) and outcomes == [[None] * 4]
        image = take_image(settings, tmp_path / "image")
    restore_image(image, settings)  # as the crash left it
    [journal] = files(settings, ".txn")
    records = list(codec.scan_journal(journal))[-7:]  # 3 keys, then 4 adds
    assert [r[0] for r in records] == [codec.MASTER_KEY] * 3 + [codec.ADD] * 4
    start = records[0][2] - codec.RECORD.size - len(records[0][1])
    ends = {}  # what each record makes: a ledger's key, or an entry
    for (_type, _payload, end, *_), made in zip(records, [*keys, *entries]):
        ends[made] = end

    for cut in range(start, records[-1][2] + 1):
        restore_image(image, settings)
        with open(journal, "r+b") as f:
            f.truncate(cut)
        with Bookie(settings) as bookie:
            for ledger_id, key in keys.items():
                if cut < ends[ledger_id]:
                    assert not bookie.ledger_exists(ledger_id), f"cut at {cut}"
                    continue
                with pytest.raises(Unauthorized):  # the ledger has its key, no other
                    bookie.fence(ledger_id, b"other key")
                bookie.add_entry(ledger_id, 10, make_entry(ledger_id, 10, -1, b"x"), key)
            for (ledger_id, entry_id), data in entries.items():
                if cut >= ends[(ledger_id, entry_id)]:
                    assert bookie.read_entry(ledger_id, entry_id) == data, f"cut at {cut}"
                elif cut >= ends[ledger_id]:
                    with pytest.raises(NoSuchEntry):
                        bookie.read_entry(ledger_id, entry_id)


def test_tiny_entries_kept_as_views_cost_no_more_memory_than_copies():
    import tracemalloc

    from pybk.storage.entries import ENTRY_HEADER

    n = 4000
    run = wire.AddRun(1, list(range(n)), [ENTRY_HEADER.pack(1, e, e - 1) for e in range(n)],
                      KEY)
    body = wire.encode_adds([run], LIMIT)
    assert len(body) > 8192  # a server keeps it as a view of its ZeroMQ message
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = wire.decode_adds(body, LIMIT)[0].entries  # what a write cache keeps
        held = len(body) if any(isinstance(e, memoryview) for e in kept) else 0
        as_decoded = tracemalloc.get_traced_memory()[0] - before + held  # views hold body
        del kept
        before = tracemalloc.get_traced_memory()[0]
        copies = list(map(bytes, wire.decode_adds(body, LIMIT)[0].entries))
        as_copies = tracemalloc.get_traced_memory()[0] - before
        del copies
    finally:
        tracemalloc.stop()
    assert as_decoded <= 1.5 * as_copies
