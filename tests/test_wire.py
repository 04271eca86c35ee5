"""The wire protocol (pybk.net.wire): every operation round-trips through the codec
and through a real bookie server over loopback TCP; the decoders and the server survive
truncated, mutated, oversized and random input."""

from __future__ import annotations

import random
import struct
import time

import pytest
from conftest import KEY, entry
from zmqutil import LOOPBACK, RawDealer

from pybk import errors
from pybk.errors import (
    BookKeeperError,
    ClientClosed,
    EntryTooLarge,
    InvalidConfiguration,
    LedgerFenced,
    MalformedMessage,
    NoSuchEntry,
    NoSuchLedger,
    TooManyRequests,
    Unauthorized,
    error_for_code,
)
from pybk.net import BookieServer, ZmqBookieClient, wire
from pybk.net.frames import ZERO_COPY_MIN_BYTES
from pybk.net.wire import (
    MAGIC,
    REPLY_HEADER,
    REQUEST_HEADER,
    VERSION,
    BookieInfo,
    Op,
    Reply,
    Request,
)
from pybk.settings import ClientSettings
from pybk.storage import LAST_ENTRY
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)

MAX = 64 * 1024  # the entry limit of the codec tests and of the fuzzed server
INFO = wire.encode_info(BookieInfo(free_bytes=1, total_bytes=2, read_only=True))



def add_request(request_id: int, *runs: wire.AddRun, max_entry_bytes: int = MAX) -> Request:
    return Request(Op.ADD, request_id, entry=wire.encode_adds(runs, max_entry_bytes))


def run(ledger_id: int, entry_ids: list[int], key: bytes = KEY, recovery: bool = False,
        entries: list[bytes] | None = None) -> wire.AddRun:
    """A run of well-formed entries (or of ``entries``)."""
    return wire.AddRun(ledger_id, entry_ids,
                       [entry(ledger_id, e) for e in entry_ids] if entries is None
                       else entries, key, recovery)


RUNS = [run(7, [1, 2, 3], recovery=True), run(8, [0], key=b""), run(7, [4, 9]),
        run(2 ** 64 - 1, [2 ** 63 - 1], b"k" * wire.MAX_MASTER_KEY_BYTES, entries=[b""])]
REQUESTS = [
    add_request(1, run(7, [0])),
    add_request(2, *RUNS),
    Request(Op.READ, 3, 7, 0),
    Request(Op.READ, 4, 7, LAST_ENTRY, flags=wire.FENCE, master_key=KEY),
    Request(Op.READ_LAC, 5, 7),
    Request(Op.WRITE_LAC, 6, 7, lac=1, master_key=KEY),
    Request(Op.LONG_POLL, 7, 7, 2, lac=1, timeout_ms=wire.MAX_LONG_POLL_MS),
    Request(Op.INFO, 8),
    Request(Op.DELETE, 2 ** 64 - 1, 2 ** 64 - 1),
    Request(Op.READ_BATCH, 9, 7, entry=wire.encode_read_batch([0, 3, 2 ** 63 - 1], 1)),
]
REPLIES = [
    Reply(Op.ADD, 1, body=wire.encode_add_statuses([0])),
    Reply(Op.ADD, 2, message="LedgerFenced: ledger 7 is fenced",
          body=wire.encode_add_statuses([LedgerFenced.code, 0, Unauthorized.code])),
    Reply(Op.READ, 3, body=entry(7, 0)),
    Reply(Op.READ_LAC, 5, lac=-1),
    Reply(Op.WRITE_LAC, 6),
    Reply(Op.LONG_POLL, 7, lac=2, body=entry(7, 2)),
    Reply(Op.LONG_POLL, 7, lac=1),
    Reply(Op.INFO, 8, body=INFO),
    Reply(Op.DELETE, 9),
    Reply(Op.READ, 10, status=NoSuchEntry.code, message="ledger 7 has no entry 9 ✓"),
    Reply(wire.UNKNOWN_OP, 11, status=MalformedMessage.code, message="unknown operation"),
    Reply(Op.READ_BATCH, 12, body=wire.encode_read_answers(
        [0, NoSuchEntry.code, 0], [entry(7, 0), b"", entry(7, 2)], MAX)),
    Reply(Op.READ_BATCH, 13, status=NoSuchLedger.code, message="no ledger 7"),
]


def raw_request(op: int = Op.READ_LAC, *, flags: int = 0, key: bytes = b"",
                key_length: int | None = None, request_id: int = 1, ledger_id: int = 7,
                entry_id: int = 0, lac: int = 0, timeout_ms: int = 0, magic: bytes = MAGIC,
                version: int = VERSION) -> bytes:
    """A request header packed as given, unchecked."""
    return REQUEST_HEADER.pack(magic, version, op, flags,
                               len(key) if key_length is None else key_length, request_id,
                               ledger_id, entry_id, lac, timeout_ms) + key


def raw_reply(op: int = Op.READ_LAC, *, status: int = 0, request_id: int = 1, lac: int = 0,
              message: bytes = b"", message_length: int | None = None) -> bytes:
    """A reply header packed as given, unchecked."""
    return REPLY_HEADER.pack(MAGIC, VERSION, op, status, request_id, lac,
                             len(message) if message_length is None else message_length
                             ) + message


# -- the codec ------------------------------------------------------------------------

@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r.op.name}-{r.request_id}")
def test_every_request_round_trips(request_):
    frames = wire.encode_request(request_, MAX)
    assert len(frames) == (2 if request_.op in (Op.ADD, Op.READ_BATCH) else 1)
    assert wire.decode_request(frames, MAX) == request_
    assert wire.peek_request_id(frames) == request_.request_id


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: f"{r.op}-{r.request_id}")
def test_every_reply_round_trips(reply):
    assert wire.decode_reply(wire.encode_reply(reply, MAX), MAX) == reply


def test_the_header_is_laid_out_as_documented():
    header, = wire.encode_request(Request(Op.READ, 0x0102, 0x0304, 5, flags=wire.FENCE,
                                          master_key=b"K"), MAX)
    assert header == (b"PB" + bytes([3, 2]) + b"\x00\x01" + b"\x00\x01"
                      + (0x0102).to_bytes(8, "big") + (0x0304).to_bytes(8, "big")
                      + (5).to_bytes(8, "big") + bytes(8) + bytes(4) + b"K")
    reply, = wire.encode_reply(Reply(Op.READ_LAC, 9, lac=-1), MAX)
    assert reply == (b"PB" + bytes([3, 3]) + bytes(4) + (9).to_bytes(8, "big")
                     + b"\xff" * 8 + bytes(2))


def test_add_bodies_are_laid_out_as_documented():
    header, body = wire.encode_request(add_request(
        3, wire.AddRun(0x0304, [5, 6], [b"E", b"FG"], b"K", True),
        wire.AddRun(6, [0], [b""], b"")), MAX)
    assert header == (b"PB" + bytes([3, 1]) + bytes(4) + (3).to_bytes(8, "big") + bytes(28))
    assert body == ((2).to_bytes(4, "big")
                    + (0x0304).to_bytes(8, "big") + b"\x00\x02" + b"\x00\x01"
                    + (2).to_bytes(4, "big") + b"K" + (5).to_bytes(8, "big")
                    + (6).to_bytes(8, "big") + (1).to_bytes(4, "big") + (2).to_bytes(4, "big")
                    + b"EFG"
                    + (6).to_bytes(8, "big") + bytes(2 + 2) + (1).to_bytes(4, "big")
                    + bytes(8 + 4))
    assert wire.encode_add_statuses([0, -3]) == bytes(4) + (-3).to_bytes(4, "big",
                                                                        signed=True)


def test_read_batch_bodies_are_laid_out_as_documented():
    assert wire.encode_read_batch([5, 0x0304], 1000) == (
        (2).to_bytes(4, "big") + (1000).to_bytes(4, "big") + (5).to_bytes(8, "big")
        + (0x0304).to_bytes(8, "big"))
    assert wire.encode_read_answers([0, -13, 0], [b"E", b"", b"FG"], MAX) == (
        (3).to_bytes(4, "big") + bytes(4) + (-13).to_bytes(4, "big", signed=True) + bytes(4)
        + (1).to_bytes(4, "big") + bytes(4) + (2).to_bytes(4, "big") + b"EFG")


def test_read_batch_bodies_round_trip():
    assert wire.decode_read_batch(wire.encode_read_batch([9, 1, 4], 77)) == ([9, 1, 4], 77)
    body = wire.encode_read_answers([0, NoSuchEntry.code], [b"entry", b""], MAX)
    assert wire.decode_read_answers(body, 2, MAX) == ([0, NoSuchEntry.code], [b"entry", b""])
    assert wire.decode_read_answers(body, 5, MAX)[1] == [b"entry", b""]  # a prefix
    with pytest.raises(MalformedMessage):  # more answers than entries asked for
        wire.decode_read_answers(body, 1, MAX)
    with pytest.raises(EntryTooLarge):
        wire.decode_read_answers(wire.encode_read_answers([0], [bytes(MAX + 1)], MAX + 1),
                                 1, MAX)


def read_batch_body(*entry_ids: int, count: int | None = None, max_bytes: int = 100) -> bytes:
    """A READ_BATCH body packed as given, unchecked."""
    return (wire.READ_BATCH_HEADER.pack(len(entry_ids) if count is None else count,
                                        max_bytes)
            + struct.pack(f">{len(entry_ids)}q", *entry_ids))


def answers_body(statuses: tuple[int, ...], lengths: tuple[int, ...], entries: bytes,
                 count: int | None = None) -> bytes:
    """A READ_BATCH reply body packed as given, unchecked."""
    n = len(statuses)
    return ((n if count is None else count).to_bytes(4, "big")
            + struct.pack(f">{n}i{len(lengths)}I", *statuses, *lengths) + entries)


MALFORMED_READ_BATCHES = {
    "no header": b"\x00\x00\x00\x01",
    "no entry ids": read_batch_body(),
    "more ids than counted": read_batch_body(1, 2, count=1),
    "fewer ids than counted": read_batch_body(1, count=2),
    "an id cut": read_batch_body(1)[:-1],
    "negative entry id": read_batch_body(-1),
    "no byte budget": read_batch_body(1, max_bytes=0),
    "count over the limit": read_batch_body(count=wire.MAX_READS_PER_MESSAGE + 1),
}


@pytest.mark.parametrize("body", MALFORMED_READ_BATCHES.values(), ids=MALFORMED_READ_BATCHES)
def test_malformed_read_batch_bodies_are_refused(body):
    with pytest.raises(MalformedMessage):
        wire.decode_read_batch(body)


MALFORMED_ANSWERS = {
    "no count": b"\x00",
    "no answers": answers_body((), (), b""),
    "lengths cut": answers_body((0,), (), b"", count=1),
    "entry cut": answers_body((0,), (5,), b"abcd"),
    "bytes after the entries": answers_body((0,), (1,), b"ab"),
    "an entry for a failed read": answers_body((NoSuchEntry.code,), (1,), b"a"),
}


@pytest.mark.parametrize("body", MALFORMED_ANSWERS.values(), ids=MALFORMED_ANSWERS)
def test_malformed_read_answers_are_refused(body):
    with pytest.raises(MalformedMessage):
        wire.decode_read_answers(body, 4, MAX)


@pytest.mark.parametrize("count", [1, 2, 1000])
def test_the_reply_to_adds_that_all_succeeded_is_the_general_encoding(count):
    """The server's shortcut for an ADD reply encodes exactly what encode_reply does."""
    general = wire.encode_reply(Reply(Op.ADD, 2**64 - 1, body=wire.encode_add_statuses(
        [0] * count)), MAX)
    assert wire.encode_adds_durable(2**64 - 1, count) == general
    assert wire.decode_add_statuses(wire.decode_reply(general, MAX).required_body(),
                                    count) is None


def test_add_bodies_and_statuses_round_trip():
    assert wire.decode_adds(wire.encode_adds(RUNS, MAX), MAX) == RUNS
    assert wire.decode_add_statuses(wire.encode_add_statuses([0, 0]), 2) is None
    assert wire.decode_add_statuses(wire.encode_add_statuses([0, -3]), 2) == [0, -3]
    with pytest.raises(MalformedMessage):
        wire.decode_add_statuses(wire.encode_add_statuses([0, 0]), 3)


@pytest.mark.parametrize("as_view", [False, True], ids=["bytes", "view"])
def test_decoded_entries_are_read_only_views_of_the_body_and_keys_copies(as_view):
    """A bookie keeps an ADD's entries as they arrived: no copy per entry, from a body
    received as bytes or as a view of its ZeroMQ message (pybk/net/frames.py)."""
    body_bytes = bytes(wire.VIEW_MIN_MEAN_BYTES)  # mostly entries (see the tests below)
    sent = [run(7, [1, 2], entries=[entry(7, e, body_bytes) for e in (1, 2)]),
            run(8, [0], key=b"", entries=[entry(8, 0, body_bytes)])]
    body = wire.encode_adds(sent, MAX)
    received = memoryview(bytearray(body)) if as_view else body  # a writable view too
    runs = wire.decode_adds(received, MAX)
    assert runs == sent
    for decoded in runs:
        assert type(decoded.master_key) is bytes
        for view in decoded.entries:
            assert isinstance(view, memoryview) and view.readonly
            assert view.obj is (received.obj if as_view else body)


def test_a_body_mostly_of_keys_and_ids_is_decoded_into_copies_of_its_entries():
    """Views would keep the whole body alive for entries that are a small part of it (a
    bookie's write cache counts the entries): such a body's entries are copies."""
    key = b"k" * wire.MAX_MASTER_KEY_BYTES
    runs = [run(ledger_id, [0], key) for ledger_id in range(1, 11)]
    body = wire.encode_adds(runs, MAX)
    decoded = wire.decode_adds(memoryview(body).toreadonly(), MAX)
    assert decoded == runs
    assert all(type(e) is bytes for r in decoded for e in r.entries)


def test_small_entries_are_decoded_into_copies():
    """A view object takes more memory than a small entry's bytes: entries that average
    under VIEW_MIN_MEAN_BYTES are copies."""
    body = wire.encode_adds(RUNS[:3], MAX)
    decoded = wire.decode_adds(memoryview(body).toreadonly(), MAX)
    assert decoded == RUNS[:3]
    assert all(type(e) is bytes for r in decoded for e in r.entries)


def add_body(*records: bytes, count: int | None = None) -> bytes:
    """An ADD body of raw records, unchecked."""
    return (len(records) if count is None else count).to_bytes(4, "big") + b"".join(records)


def raw_run(ledger_id: int = 7, entry_ids: tuple[int, ...] = (0,), flags: int = 0,
            key: bytes = KEY, entries: tuple[bytes, ...] = (b"data",),
            key_length: int | None = None, count: int | None = None,
            lengths: tuple[int, ...] | None = None) -> bytes:
    """A run packed as given, unchecked."""
    n = len(entry_ids)
    lengths = tuple(map(len, entries)) if lengths is None else lengths
    return (wire.RUN_HEADER.pack(ledger_id, flags, len(key) if key_length is None
                                 else key_length, n if count is None else count)
            + key + struct.pack(f">{n}q{len(lengths)}I", *entry_ids, *lengths)
            + b"".join(entries))


MALFORMED_ADD_BODIES = {
    "no count": b"\x00\x00",
    "no runs": add_body(),
    "more runs than counted": add_body(raw_run(), raw_run(), count=1),
    "fewer runs than counted": add_body(raw_run(), count=2),
    "run header cut": add_body(raw_run())[:14],
    "entry ids cut": add_body(raw_run())[:4 + wire.RUN_HEADER.size + len(KEY) + 4],
    "entry cut": add_body(raw_run())[:-1],
    "key length past the body": add_body(raw_run(key_length=200)),
    "entry lengths past the body": add_body(raw_run(lengths=(100,))),
    "unknown flag": add_body(raw_run(flags=0x1)),
    "negative entry id": add_body(raw_run(entry_ids=(-1,))),
    "key over the limit": add_body(raw_run(key=b"k" * 1025)),
    "an empty run": add_body(raw_run(entry_ids=(), entries=())),
    "more adds than a message carries": add_body(
        raw_run(count=wire.MAX_ADDS_PER_MESSAGE + 1)),
    "adds over the limit in all runs": add_body(
        raw_run(entry_ids=tuple(range(wire.MAX_ADDS_PER_MESSAGE)),
                entries=(b"",) * wire.MAX_ADDS_PER_MESSAGE), raw_run()),
    "count over the limit": add_body(count=wire.MAX_ADDS_PER_MESSAGE + 1),
}


@pytest.mark.parametrize("body", MALFORMED_ADD_BODIES.values(), ids=MALFORMED_ADD_BODIES)
def test_malformed_add_bodies_are_refused(body):
    with pytest.raises(MalformedMessage):
        wire.decode_adds(body, MAX)


def test_long_error_messages_are_cut_at_a_character_boundary():
    reply = Reply(Op.READ, 1, status=NoSuchEntry.code, message="é" * 5000)
    decoded = wire.decode_reply(wire.encode_reply(reply, MAX), MAX)
    assert decoded.message == "é" * (wire.MAX_MESSAGE_BYTES // 2)


ADD_BODY = wire.encode_adds([run(7, [0])], MAX)
MALFORMED_REQUESTS = {
    "empty message": [],
    "wrong magic": [raw_request(magic=b"BK")],
    "older version": [raw_request(version=VERSION - 1)],
    "newer version": [raw_request(version=VERSION + 1)],
    "operation 0": [raw_request(op=0)],
    "unknown operation": [raw_request(op=99)],
    "flag on the wrong operation": [raw_request(Op.ADD, flags=wire.FENCE), ADD_BODY],
    "unknown flag": [raw_request(Op.READ, flags=0x80)],
    "key without fencing": [raw_request(Op.READ, key=KEY)],
    "key where none is used": [raw_request(Op.READ_LAC, key=KEY)],
    "key length past the header": [raw_request(Op.WRITE_LAC, key=KEY, key_length=40)],
    "key length short of the header": [raw_request(Op.WRITE_LAC, key=KEY, key_length=2)],
    "key over the limit": [raw_request(Op.WRITE_LAC, key=b"k" * 1025)],
    "entry id where none is used": [raw_request(Op.READ_LAC, entry_id=3)],
    "LAC where none is used": [raw_request(Op.READ, lac=3)],
    "timeout where none is used": [raw_request(Op.READ, timeout_ms=3)],
    "entry id below -1": [raw_request(Op.READ, entry_id=-2)],
    "entry id in an ADD header": [raw_request(Op.ADD, entry_id=1), ADD_BODY],
    "key in an ADD header": [raw_request(Op.ADD, key=KEY), ADD_BODY],
    "LAC below -1": [raw_request(Op.WRITE_LAC, lac=-2, key=KEY)],
    "long poll without timeout": [raw_request(Op.LONG_POLL, lac=1)],
    "long poll too long": [raw_request(Op.LONG_POLL, timeout_ms=wire.MAX_LONG_POLL_MS + 1)],
    "ADD without its body": [raw_request(Op.ADD)],
    "READ with an entry frame": [raw_request(Op.READ), entry(7, 0)],
    "READ_BATCH without its ids": [raw_request(Op.READ_BATCH)],
    "key in a READ_BATCH": [raw_request(Op.READ_BATCH, key=KEY), read_batch_body(1)],
    "entry id in a READ_BATCH header": [raw_request(Op.READ_BATCH, entry_id=1),
                                        read_batch_body(1)],
    "three frames": [raw_request(Op.ADD), ADD_BODY, b"more"],
}


@pytest.mark.parametrize("frames", MALFORMED_REQUESTS.values(), ids=MALFORMED_REQUESTS)
def test_malformed_requests_are_refused(frames):
    with pytest.raises(MalformedMessage):
        wire.decode_request(frames, MAX)


def test_truncated_request_headers_are_refused_at_every_length():
    header = wire.encode_request(REQUESTS[3], MAX)[0]
    for length in range(len(header)):
        with pytest.raises(MalformedMessage):
            wire.decode_request([header[:length]], MAX)


def test_oversized_entries_are_refused_on_both_sides():
    big = [run(7, [0], entries=[bytes(MAX + 1)])]
    with pytest.raises(EntryTooLarge):
        wire.encode_adds(big, MAX)
    with pytest.raises(EntryTooLarge):
        wire.decode_adds(wire.encode_adds(big, MAX + 1), MAX)
    two = [run(7, [0, 1], entries=[bytes(MAX), bytes(MAX)])]
    with pytest.raises(EntryTooLarge):  # each fits, together they are over the body limit
        wire.encode_adds(two, MAX)
    frames = wire.encode_request(Request(Op.ADD, 1, entry=wire.encode_adds(two, 2 * MAX)),
                                 2 * MAX)
    with pytest.raises(EntryTooLarge):
        wire.decode_request(frames, MAX)
    with pytest.raises(EntryTooLarge):
        wire.decode_reply(wire.encode_reply(Reply(Op.READ, 1, body=bytes(MAX + 1)),
                                            MAX + 1), MAX)


MALFORMED_REPLIES = {
    "success with a message": [raw_reply(message=b"hi")],
    "error with a body": [raw_reply(Op.READ, status=-13), b"body"],
    "error with a LAC": [raw_reply(status=-13, lac=4)],
    "READ without its entry": [raw_reply(Op.READ)],
    "READ_BATCH without its answers": [raw_reply(Op.READ_BATCH)],
    "READ_BATCH answers over the limit": [raw_reply(Op.READ_BATCH),
                                          bytes(wire.max_add_body_bytes(MAX) + 1)],
    "ADD without statuses": [raw_reply(Op.ADD)],
    "ADD statuses cut": [raw_reply(Op.ADD), b"abc"],
    "LAC on an ADD reply": [raw_reply(Op.ADD, lac=4), bytes(4)],
    "INFO body too short": [raw_reply(Op.INFO), INFO[:-1]],
    "INFO read-only flag not 0/1": [raw_reply(Op.INFO), INFO[:-1] + b"\x02"],
    "message not UTF-8": [raw_reply(status=-13, message=b"\xff\xfe")],
    "message length past the header": [raw_reply(status=-13, message=b"x",
                                                 message_length=9)],
    "message over the limit": [raw_reply(status=-13, message=b"x" * 1025)],
    "three frames": [raw_reply(Op.READ), b"a", b"b"],
    "unknown operation": [raw_reply(99)],
    "success for no operation": [raw_reply(wire.UNKNOWN_OP)],
    "truncated": [raw_reply()[:20]],
}


@pytest.mark.parametrize("frames", MALFORMED_REPLIES.values(), ids=MALFORMED_REPLIES)
def test_malformed_replies_are_refused(frames):
    with pytest.raises(MalformedMessage):
        wire.decode_reply(frames, MAX)


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """A random damage of a message: flipped, cut or added bytes, frames dropped, added
    or duplicated, or plain noise."""
    frames = [bytearray(f) for f in frames]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(frames)) if frames else 0
        kind = rng.randrange(7)
        if kind == 0 and frames and frames[i]:
            frames[i][rng.randrange(len(frames[i]))] ^= 1 << rng.randrange(8)
        elif kind == 1 and frames:
            del frames[i][rng.randrange(len(frames[i]) + 1):]
        elif kind == 2 and frames:
            frames[i] += rng.randbytes(rng.randint(1, 16))
        elif kind == 3 and frames:
            del frames[i]
        elif kind == 4:
            frames.append(bytearray(rng.randbytes(rng.randint(0, 64))))
        elif kind == 5 and frames:
            frames.insert(i, bytearray(frames[i]))
        else:
            frames = [bytearray(rng.randbytes(rng.randint(0, 80)))
                      for _ in range(rng.randint(0, 3))]
    return [bytes(f) for f in frames]


VALID_MESSAGES = ([wire.encode_request(r, MAX) for r in REQUESTS]
                  + [wire.encode_reply(r, MAX) for r in REPLIES])


def test_decoders_raise_only_format_errors_and_accept_only_canonical_messages():
    rng = random.Random(20240601)
    accepted = 0
    for _ in range(20_000):
        frames = mutate(rng, rng.choice(VALID_MESSAGES))
        for decode, encode in ((wire.decode_request, wire.encode_request),
                               (wire.decode_reply, wire.encode_reply)):
            try:
                decoded = decode(frames, MAX)
            except (MalformedMessage, EntryTooLarge):
                continue
            accepted += 1
            # Whatever decodes is exactly what the encoder writes for it.
            assert encode(decoded, MAX) == frames
    assert accepted > 100  # the mutations also produce valid messages (e.g. other ids)


def test_add_body_decoding_raises_only_format_errors_and_accepts_only_canonical_bodies():
    rng = random.Random(20261121)
    bodies = [r.entry for r in REQUESTS if r.op == Op.ADD]
    accepted = 0
    for _ in range(20_000):
        body = b"".join(mutate(rng, [rng.choice(bodies)]))
        try:
            adds = wire.decode_adds(body, MAX)
        except (MalformedMessage, EntryTooLarge):
            continue
        accepted += 1
        assert wire.encode_adds(adds, MAX) == body
    assert accepted > 100


# -- through a server ---------------------------------------------------------------------

@pytest.fixture
def server(bookie_factory, settings_factory, closing):
    bookie = bookie_factory(settings_factory(maxEntrySizeBytes=MAX))
    return closing.enter_context(BookieServer(bookie, LOOPBACK))


@pytest.fixture
def client(server, closing):
    return closing.enter_context(ZmqBookieClient(
        "B1", server.address, ClientSettings(readTimeout=5, addEntryTimeout=5,
                                             maxEntrySizeBytes=2 * MAX)))


def test_every_operation_round_trips_through_a_server(server, client):
    for e in range(3):
        assert client.add(7, e, entry(7, e, lac=e - 1), KEY).result(timeout=WAIT_S) is None
    assert client.read(7, 1).result(timeout=WAIT_S) == entry(7, 1, lac=0)
    assert client.read(7, LAST_ENTRY).result(timeout=WAIT_S) == entry(7, 2, lac=1)
    assert client.read_lac(7).result(timeout=WAIT_S) == 1
    assert client.write_lac(7, 2, KEY).result(timeout=WAIT_S) is None
    assert client.read_lac(7).result(timeout=WAIT_S) == 2
    assert client.read_lac_long_poll(7, 1, 2, 5).result(timeout=WAIT_S) == (2, entry(7, 2,
                                                                                  lac=1))
    waiting = client.read_lac_long_poll(7, 2, 3, 10)
    assert client.read_lac_long_poll(7, 2, 3, 0.05).result(timeout=WAIT_S) == (2, None)
    assert not waiting.done()
    client.add(7, 3, entry(7, 3, lac=2), KEY).result(timeout=WAIT_S)
    client.add(7, 4, entry(7, 4, lac=3), KEY).result(timeout=WAIT_S)
    assert waiting.result(timeout=WAIT_S) == (3, entry(7, 3, lac=2))
    info = client.bookie_info().result(timeout=WAIT_S)
    assert 0 < info.free_bytes <= info.total_bytes and info.read_only is False
    assert client.read(7, LAST_ENTRY, fence=True, master_key=KEY).result(timeout=WAIT_S) == \
        entry(7, 4, lac=3)
    with pytest.raises(LedgerFenced):
        client.add(7, 5, entry(7, 5), KEY).result(timeout=WAIT_S)
    client.add(7, 5, entry(7, 5), KEY, recovery=True).result(timeout=WAIT_S)
    assert client.delete_ledger(7).result(timeout=WAIT_S) is None
    with pytest.raises(NoSuchLedger):
        client.read(7, 0).result(timeout=WAIT_S)


def test_a_read_batch_answers_each_entry_in_order_within_its_byte_budget(server, client):
    for e in range(4):
        client.add(7, e, entry(7, e), KEY).result(timeout=WAIT_S)
    entries = [entry(7, e) for e in range(4)]
    answers = client.read_batch(7, [2, 0, 9, 3], 2 ** 32 - 1).result(timeout=WAIT_S)
    assert answers[0] == entries[2] and answers[1] == entries[0] and answers[3] == entries[3]
    assert isinstance(answers[2], NoSuchEntry) and "bookie B1" in str(answers[2])
    # The budget counts the entries' bytes; the first id is answered whatever its size.
    two = len(entries[0]) + len(entries[1])
    assert client.read_batch(7, [0, 1, 2], two).result(timeout=WAIT_S) == entries[:2]
    assert client.read_batch(7, [0, 1, 2], two - 1).result(timeout=WAIT_S) == entries[:1]
    assert client.read_batch(7, [3, 1], 1).result(timeout=WAIT_S) == [entries[3]]
    missing = client.read_batch(8, [0, 1], 1).result(timeout=WAIT_S)
    assert [type(answer) for answer in missing] == [NoSuchLedger, NoSuchLedger]


def test_a_read_batch_is_cut_to_what_one_message_may_carry(server, closing):
    """However many ids the caller gives, one request carries at most what fits the body
    limit of a bookie with the client's maximum entry size (the caller asks again for the
    rest)."""
    client = closing.enter_context(ZmqBookieClient("B1", server.address,
                                                   ClientSettings(maxEntrySizeBytes=MAX)))
    many = wire.max_read_batch_ids(MAX) + 100
    answers = client.read_batch(7, list(range(many)), 2 ** 32 - 1).result(timeout=WAIT_S)
    assert len(answers) == wire.max_read_batch_ids(MAX)
    assert all(isinstance(answer, NoSuchLedger) for answer in answers)


def test_bookie_errors_come_back_as_the_same_exceptions(server, client):
    client.add(8, 0, entry(8, 0), KEY).result(timeout=WAIT_S)
    with pytest.raises(NoSuchEntry, match="bookie B1"):
        client.read(8, 9).result(timeout=WAIT_S)
    with pytest.raises(Unauthorized):
        client.add(8, 1, entry(8, 1), b"other key").result(timeout=WAIT_S)
    with pytest.raises(EntryTooLarge):  # the bookie's limit, under the client's
        client.add(8, 1, entry(8, 1, body=bytes(MAX)), KEY).result(timeout=WAIT_S)
    with pytest.raises(MalformedMessage):  # refused before sending
        client.read_lac_long_poll(8, 0, 1, wire.MAX_LONG_POLL_MS + 1).result(timeout=WAIT_S)


def test_a_status_rebuilds_the_errors_a_bookie_may_send_and_no_caller_side_error():
    """A reply's status comes back as the class the bookie raised; the codes of errors
    raised only on the caller's side never come from a bookie, so a status carrying one
    is a stranger's (the base class), not a misleading configuration error."""
    for cls in errors._WIRE_ERRORS:
        rebuilt = error_for_code(cls.code, "from a bookie")
        assert type(rebuilt) is cls and str(rebuilt) == "from a bookie"
    for cls in (InvalidConfiguration, ClientClosed, TooManyRequests):
        assert type(error_for_code(cls.code, "x")) is BookKeeperError


def test_server_answers_or_drops_malformed_requests_and_keeps_serving(server, closing):
    dealer = closing.enter_context(RawDealer(server.address))
    answered = {
        "wrong version": ([raw_request(version=9, request_id=11)], MalformedMessage.code),
        "unknown operation": ([raw_request(op=42, request_id=12)], MalformedMessage.code),
        "wrong frame count": ([raw_request(Op.READ, request_id=13), b"x"],
                              MalformedMessage.code),
        "oversized body": ([raw_request(Op.ADD, request_id=14),
                            bytes(wire.max_add_body_bytes(MAX) + 1)], EntryTooLarge.code),
    }
    for frames, _ in answered.values():
        dealer.send(frames)
    statuses = {}
    for _ in answered:
        reply = wire.decode_reply(dealer.receive(timeout_s=10), MAX)
        assert reply.op == wire.UNKNOWN_OP
        statuses[reply.request_id] = reply.status
    assert statuses == {11: MalformedMessage.code, 12: MalformedMessage.code,
                        13: MalformedMessage.code, 14: EntryTooLarge.code}
    for dropped in ([b""], [b"PB\x01"], [b"not pybk at all, no request id"],
                    [b"", raw_request()]):
        dealer.send(dropped)
    dealer.send(wire.encode_request(Request(Op.INFO, 99), MAX))
    reply = wire.decode_reply(dealer.receive(timeout_s=10), MAX)
    assert (reply.request_id, reply.status) == (99, 0)  # the dropped ones got no answer


def test_server_survives_random_and_mutated_frames(server, closing):
    rng = random.Random(7)
    dealer = closing.enter_context(RawDealer(server.address))
    for i in range(3000):
        dealer.send(mutate(rng, rng.choice(VALID_MESSAGES)) or [b""])
        if i % 500 == 0:  # a frame over ZeroMQ's limit: the server drops the connection
            dealer.send([raw_request(Op.ADD), bytes(4 * MAX)])
    # A new client is served; whatever came back to the fuzzer is a well-formed reply;
    # and the fuzzer's own valid request is answered too.
    with ZmqBookieClient("B1", server.address) as fresh:
        assert fresh.bookie_info().result(timeout=WAIT_S).total_bytes > 0
    while (frames := dealer.receive(timeout_s=0.2)) is not None:
        wire.decode_reply(frames, MAX)
    dealer.send(wire.encode_request(Request(Op.INFO, 424242), MAX))
    while (frames := dealer.receive(timeout_s=10)) is not None:
        if wire.decode_reply(frames, MAX).request_id == 424242:
            break
    else:
        pytest.fail("the server did not answer a valid request after the fuzzing")


def test_entries_larger_than_the_copy_threshold_travel_intact(bookie_factory,
                                                              settings_factory, closing):
    large = 2 * ZERO_COPY_MIN_BYTES
    bookie = bookie_factory(settings_factory(maxEntrySizeBytes=large))
    server = closing.enter_context(BookieServer(bookie, LOOPBACK))
    client = closing.enter_context(ZmqBookieClient(
        "B1", server.address, ClientSettings(maxEntrySizeBytes=large)))
    body = random.Random(3).randbytes(large - 100)  # sent and answered without a copy
    client.add(9, 0, entry(9, 0, body=body), KEY).result(timeout=WAIT_S)
    assert client.read(9, 0).result(timeout=WAIT_S) == entry(9, 0, body=body)


def test_replies_to_a_client_that_stops_reading_wait_instead_of_being_dropped(server, client,
                                                                            closing):
    body = bytes(30 * 1024)
    client.add(10, 0, entry(10, 0, body=body), KEY).result(timeout=WAIT_S)
    # More replies than the client's queue (1), the sockets' buffers and the server's
    # per-client queue (1000 messages) hold: the server has to hold some back.
    slow = closing.enter_context(RawDealer(server.address, receive_hwm=1))
    count = 2500
    for request_id in range(count):
        slow.send(wire.encode_request(Request(Op.READ, request_id, 10, 0), MAX))
    time.sleep(0.5)
    answered = set()
    while len(answered) < count and (frames := slow.receive(timeout_s=10)) is not None:
        reply = wire.decode_reply(frames, MAX)
        assert reply.status == 0 and len(reply.body) == len(entry(10, 0, body=body))
        answered.add(reply.request_id)
    assert answered == set(range(count))
    assert client.read_lac(10).result(timeout=WAIT_S) == -1
