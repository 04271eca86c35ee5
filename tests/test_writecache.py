"""The write cache: lookups, re-adds, dropped ledgers, absorbing a newer cache, the
checkpoint's records grouped by ledger, and no per-ledger object for the garbage
collector to walk."""

from __future__ import annotations

import gc

from pybk.storage.writecache import WriteCache


def header(ledger_id: int, entry_id: int) -> bytes:
    return b"h%d.%d" % (ledger_id, entry_id)


def entry(ledger_id: int, entry_id: int, version: int = 0) -> bytes:
    return b"e%d.%d.%d" % (ledger_id, entry_id, version)


def put(cache: WriteCache, ledger_id: int, entry_id: int, version: int = 0) -> None:
    cache.put(ledger_id, entry_id, header(ledger_id, entry_id), entry(ledger_id, entry_id,
                                                                      version))


def put_run(cache: WriteCache, ledger_id: int, entry_ids: list[int]) -> None:
    entries = [entry(ledger_id, entry_id) for entry_id in entry_ids]
    cache.put_run(ledger_id, entry_ids, [header(ledger_id, e) for e in entry_ids], entries,
                  sum(map(len, entries)))


def test_lookups_and_a_later_put_wins() -> None:
    cache = WriteCache()
    put(cache, 7, 0)
    put_run(cache, 3, [0, 1, 2])
    put(cache, 7, 1)
    put(cache, 7, 0, version=1)
    assert cache.get(7, 0) == entry(7, 0, 1)
    assert cache.get(3, 2) == entry(3, 2)
    assert cache.get(3, 3) is None and cache.get(4, 0) is None
    assert cache.last_entry_id(7) == 1 and cache.last_entry_id(3) == 2
    assert cache.last_entry_id(4) is None
    assert cache.entry_ids(7) == [0, 1] and cache.entry_ids(4) == []
    assert sorted(cache.ledger_ids()) == [3, 7]
    assert cache.size_bytes == sum(len(entry(7, i)) for i in (0, 1, 0)) + sum(
        len(entry(3, i)) for i in range(3))


def test_records_are_grouped_by_ledger_in_arrival_order() -> None:
    cache = WriteCache()
    for i in range(6):  # round-robin over ledgers 2, 1, 3
        put(cache, (2, 1, 3)[i % 3], i // 3)
    put(cache, 1, 0, version=1)  # a re-add: both records go, the later one last
    buffers, entry_ids, runs = cache.records()
    assert runs == [(1, 3), (2, 2), (3, 2)]
    assert entry_ids == [0, 1, 0, 0, 1, 0, 1]
    assert buffers[1::2] == [entry(1, 0), entry(1, 1), entry(1, 0, 1), entry(2, 0),
                             entry(2, 1), entry(3, 0), entry(3, 1)]
    assert buffers[0::2] == [header(1, 0), header(1, 1), header(1, 0), header(2, 0),
                             header(2, 1), header(3, 0), header(3, 1)]


def test_records_already_together_keep_their_order_and_skipped_ledgers_go() -> None:
    cache = WriteCache()
    for ledger_id in (9, 4, 6):
        put_run(cache, ledger_id, [0, 1])
    buffers, entry_ids, runs = cache.records(skip_ledgers={4})
    assert runs == [(9, 2), (6, 2)]
    assert entry_ids == [0, 1, 0, 1]
    assert buffers[1::2] == [entry(9, 0), entry(9, 1), entry(6, 0), entry(6, 1)]
    assert WriteCache().records() == ([], [], [])


def test_a_dropped_ledger_leaves_nothing_and_may_come_back() -> None:
    cache = WriteCache()
    for i in range(4):
        put(cache, 1 + i % 2, i // 2)
    cache.drop_ledger(2)
    cache.drop_ledger(5)  # never held: nothing happens
    assert cache.get(2, 0) is None and cache.last_entry_id(2) is None
    assert cache.entry_ids(2) == [] and cache.ledger_ids() == [1]
    assert cache.size_bytes == len(entry(1, 0)) + len(entry(1, 1))
    put(cache, 2, 5)
    assert cache.entry_ids(2) == [5] and cache.last_entry_id(2) == 5
    buffers, entry_ids, runs = cache.records()
    assert runs == [(1, 2), (2, 1)]
    assert entry_ids == [0, 1, 5]
    assert buffers[1::2] == [entry(1, 0), entry(1, 1), entry(2, 5)]


def test_a_ledger_with_an_entry_put_twice_is_dropped_whole() -> None:
    """A recovery re-writes entries a bookie holds already: deleting the ledger then
    (issue 31, section 6: fenced, recovered, deleted) must drop both records."""
    cache = WriteCache()
    put(cache, 1, 0)
    put(cache, 2, 0)
    put(cache, 1, 0, version=1)
    cache.drop_ledger(1)
    assert cache.get(1, 0) is None and cache.entry_ids(1) == []
    assert cache.ledger_ids() == [2] and cache.size_bytes == len(entry(2, 0))


def test_absorb_puts_the_newer_records_after() -> None:
    older, newer = WriteCache(), WriteCache()
    put(older, 1, 0)
    put(older, 2, 0)
    put(newer, 1, 0, version=1)
    put(newer, 3, 4)
    older.absorb(newer)
    assert older.get(1, 0) == entry(1, 0, 1) and older.get(3, 4) == entry(3, 4)
    assert older.last_entry_id(3) == 4
    assert older.size_bytes == sum(len(entry(*ids)) for ids in ((1, 0), (2, 0), (1, 0),
                                                                (3, 4)))
    _buffers, entry_ids, runs = older.records()
    assert runs == [(1, 2), (2, 1), (3, 1)] and entry_ids == [0, 0, 0, 4]


def test_no_object_per_ledger_or_add_for_the_garbage_collector() -> None:
    """The cost of an add must not grow with the ledgers held: the collector's passes
    walk tracked objects, and the cache makes a fixed few of them, whatever it holds."""
    cache = WriteCache()
    gc.collect()
    before = len(gc.get_objects())
    for ledger_id in range(1, 20_001):
        put(cache, ledger_id, 0)
    put_run(cache, 5, [1, 2])
    assert len(gc.get_objects()) - before < 10


def test_ids_up_to_the_entry_headers_range() -> None:
    """Entry headers hold unsigned 64-bit ids: the largest is kept apart from the rest."""
    top = 2**64 - 1
    cache = WriteCache()
    put(cache, top, top)
    put(cache, top, 0)
    put(cache, 0, top)
    assert cache.get(top, top) == entry(top, top) and cache.get(0, top) == entry(0, top)
    assert cache.last_entry_id(top) == top
    cache.drop_ledger(top)
    put(cache, top, 1)
    assert cache.records()[2] == [(0, 1), (top, 1)]
