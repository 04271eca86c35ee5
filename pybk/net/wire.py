"""pybk's wire protocol: the requests a client sends a bookie and the bookie's replies.

Framing.  A client's DEALER socket talks to the bookie's ROUTER socket.  A message is
one ZeroMQ multipart message: a *header* frame, then, for the operations that have one,
a *body* frame holding an entry's bytes exactly as the bookie stores them.  The entry is
never joined to the header, so a large entry is handed to ZeroMQ without a copy.  (The
ROUTER sees the sender's routing id as an extra first frame and addresses the reply with
it; that frame belongs to ZeroMQ, not to this format.  There is no empty delimiter.)

All integers are big-endian.  Bytes 0-1 (magic) and 8-15 (request id) keep their place
in every protocol version, so a bookie can answer a request of a version it does not
speak with an error that the client can match.

Request header, 44 + K bytes::

    offset  size  field
         0     2  magic: 0x50 0x42 ("PB")
         2     1  version: 3
         3     1  operation (table below)
         4     2  flags: bit 0 FENCE (READ: fence the ledger, durably, before reading);
                  bit 1 HELD (FORCE_LEDGER: answer how many entries it holds);
                  every other bit 0
         6     2  K: master key length, 0..1024
         8     8  request id (unsigned): chosen by the client, carried back in the reply
        16     8  ledger id (unsigned)
        24     8  entry id (signed)
        32     8  LAC (signed)
        40     4  timeout, milliseconds (unsigned)
        44     K  master key

Reply header, 26 + M bytes::

    offset  size  field
         0     2  magic: 0x50 0x42
         2     1  version: 3
         3     1  operation: the request's; 0 in an error reply to a request that could
                  not be decoded
         4     4  status (signed): 0 for success, else a pybk error code
                  (:func:`pybk.errors.error_for_code` rebuilds the exception)
         8     8  request id: the request's
        16     8  LAC (signed)
        24     2  M: message length, 0..1024 (a sender cuts longer messages)
        26     M  message, UTF-8: what went wrong (error replies, and ADD replies with a
                  failed add)

Operations.  A field a request does not use must be 0, and K is 0 where no key is used.
An error reply has no body, LAC 0 and usually a message; a success reply has M = 0,
except an ADD reply some of whose adds failed::

    code  operation  request                                      body      success reply
       1  ADD        -                                            adds      body: statuses;
                                                                            sent once every
                                                                            add is durable
                                                                            or failed
       2  READ       entry id >= -1 (-1: the last entry held);    -         body: the entry
                     flag FENCE, then with the key
       3  READ_LAC   -                                            -         LAC
       4  WRITE_LAC  LAC >= -1 (an explicit LAC), key             -         sent once durable
       5  LONG_POLL  LAC >= -1 (the LAC the reader knows),        -         LAC; body: entry
                     entry id >= 0 (the entry wanted with a                 `entry id` if the
                     newer LAC), timeout 1..60000 ms                        LAC passed the
                                                                            known one and the
                                                                            bookie holds it
       6  INFO       -                                            -         body, 17 bytes:
                                                                            free bytes (8),
                                                                            total bytes (8),
                                                                            read-only (1: 0/1)
       7  DELETE     -                                            -         sent once durable
       8  READ_BATCH -                                            entry     body: answers
                                                                  ids
       9  FORCE_LEDGER flag HELD, entry id >= 0,                  -         sent once every
                     LAC >= entry id - 1: the                               add of the ledger
                     entries first..last asked                              made so far is
                     about (no HELD: both 0)                                durable; LAC: with
                                                                            HELD, how many
                                                                            entries of first..
                                                                            last the bookie
                                                                            holds, else 0

Adds travel in batches: one ADD message carries every add a client has ready for the
bookie (of any ledgers), so that the per-message costs on both sides are paid once per
batch rather than once per entry.  Within a message, adds come in *runs*: consecutive
adds of one ledger with one master key and one recovery flag, whose key and ledger id
travel once and whose entry ids and lengths are arrays, so that both sides handle a run
with a few C-level operations instead of a few per entry.  The body of an ADD request is
a count R (4 bytes, 1..65535) of runs followed by R runs::

    offset      size  field
         0         8  ledger id (unsigned)
         8         2  flags: bit 1 RECOVERY (recovery adds, which a fenced ledger
                      accepts), bit 2 DEFERRED_SYNC (adds of a DEFERRED_SYNC ledger: the
                      bookie may answer once they are written, before they are durable;
                      FORCE_LEDGER makes them durable); every other bit 0
        10         2  K: master key length, 0..1024
        12         4  N: adds in the run, >= 1
        16         K  master key
      16+K      8 * N  entry ids (signed, each >= 0)
      16+K+8N   4 * N  entry lengths, each at most the receiver's maximum entry size
      16+K+12N  total  the N entries, back to back, exactly as the bookie stores them

A message carries at most 65,535 adds in all.  A body is at most
:func:`max_add_body_bytes` (one run of one entry of the maximum size with the largest
key, so any legal entry fits; a sender starts a new message rather than go over).  The
success reply's body holds one status per add (4 bytes each, signed, in body order: the
first run's adds, then the second's...): 0 for an add that is durable, else the pybk
error code of its failure; the reply's message then describes the first failed add.
The bookie answers once every add of the message is durable or failed (written or failed,
when every run of the message is DEFERRED_SYNC).

Status codes are those of :mod:`pybk.errors`; a code a side does not know reads as a
plain BookKeeperError.  EntryMaybeLost (-1008) came after version 3 the same way: a
READ (fencing or not) or a READ_BATCH answer of a bookie that does not hold the entry,
of a ledger created before its disks joined the cluster (its join floor,
:meth:`pybk.storage.Bookie.record_join_floor`), where NoSuchEntry or NoSuchLedger would
claim it never had the entry.  Recovery does not count it as the entry being absent; a
client of before it reads it as an error, no answer, which is as safe.

Only READ_LAC and LONG_POLL replies carry a LAC, and FORCE_LEDGER replies a count of
entries held in that field; it is 0 in the others.

Catch-up reads travel in batches too (BookKeeper 4.17's batch read): one READ_BATCH asks
for many entries of one ledger, listed by id (so a reader of a ledger striped over an
ensemble asks each bookie for the entries it stores).  The body of a READ_BATCH request::

    offset  size  field
         0     4  N: entry ids, 1..65535
         4     4  B: the most bytes of entries the reply may carry, >= 1
         8  8 * N  entry ids (signed, each >= 0)

The success reply's body answers the first A of those ids, in order, 1 <= A <= N::

    offset      size  field
         0         4  A: answers
         4     4 * A  statuses (signed): 0 if the entry follows, else the pybk error code
                      of reading it (NoSuchEntry, NoSuchLedger...)
      4+4A     4 * A  lengths: each entry's, 0 for a failed read
      4+8A     total  the entries, back to back, exactly as the bookie stores them

The bookie answers the ids in order and stops before its answers' entries would pass B
bytes or the body the ADD body limit (:func:`max_add_body_bytes`); it always answers the
first id, so any legal entry can be read this way.  The reader asks again for the ids
not answered.  A request body is within the ADD body limit too, which bounds N for a
small maximum entry size.  READ_BATCH came after version 3 without changing any other
message: a bookie that does not know it answers MalformedMessage ("unknown operation").

Deferred sync (BookKeeper's ``WriteFlag.DEFERRED_SYNC``) came after version 3 the same
way: the run flag DEFERRED_SYNC and the operation FORCE_LEDGER (ledger id only; no key,
as BookKeeper's ForceLedger request).  A bookie that does not know them answers
MalformedMessage: to a FORCE_LEDGER ("unknown operation"), and to a whole ADD message
with a DEFERRED_SYNC run ("out of range" flags), so an older bookie never takes a deferred
add for a durable one; the client reports it as a bookie too old for deferred sync.
The flag HELD came after that, again without changing any other message: a writer counts
a bookie's force only if the bookie holds every entry of the range forced that it should
(one that restarted after a power cut may have lost deferred adds it acknowledged, and
taken later ones since: :mod:`pybk.client.deferred`).  A bookie of before it refuses the
flag as malformed; a client of before it does not set it and gets LAC 0, as before.

Decoding checks everything above (frame count, header length against K or M, magic,
version, operation, flags, key, unused fields, ranges, UTF-8, body sizes against the
receiver's maximum entry size, runs against their body) and raises
:class:`pybk.errors.MalformedMessage`, or :class:`pybk.errors.EntryTooLarge` for an
entry over the maximum.  Encoding runs the same checks, so what one side writes the
other side accepts.
"""

from __future__ import annotations

import enum
import itertools
import struct
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from pybk.errors import BookKeeperError, EntryTooLarge, MalformedMessage

MAGIC = b"PB"
VERSION = 3

#: Request flag: fence the ledger before reading (READ).
FENCE = 0x1
#: Request flag: answer how many entries of the range asked about are held (FORCE_LEDGER).
HELD = 0x2
#: Add record flag: a recovery add, accepted by a fenced ledger.
RECOVERY = 0x2
#: Add record flag: an add of a DEFERRED_SYNC ledger (acknowledged once written).
DEFERRED_SYNC = 0x4

#: BookKeeper's master keys are 20-byte SHA-1 digests; the bound keeps headers small.
MAX_MASTER_KEY_BYTES = 1024
#: Error messages are cut to this many bytes (at a character boundary).
MAX_MESSAGE_BYTES = 1024
#: Longest wait a long-poll read may ask for; a reader that wants to wait longer asks again.
MAX_LONG_POLL_MS = 60_000

REQUEST_HEADER = struct.Struct(">2sBBHHQQqqI")
ADD_COUNT = struct.Struct(">I")
RUN_HEADER = struct.Struct(">QHHI")
assert (REQUEST_HEADER.size, ADD_COUNT.size, RUN_HEADER.size) == (44, 4, 16), \
    "request headers, ADD counts and run headers are documented as 44, 4 and 16 bytes"
_RUN_FIELDS = RUN_HEADER.format.lstrip(">")  # a run header inside a larger pack
#: Bytes an add takes in a run besides its entry: its entry id and its length.
RUN_BYTES_PER_ADD = 12
_ADD_STATUS = struct.Struct(">i")
#: Most adds one ADD message carries (in all its runs).
MAX_ADDS_PER_MESSAGE = 65_535
READ_BATCH_HEADER = struct.Struct(">II")
READ_ANSWERS_COUNT = struct.Struct(">I")
assert (READ_BATCH_HEADER.size, READ_ANSWERS_COUNT.size) == (8, 4), \
    "READ_BATCH bodies are documented with an 8-byte header, replies with a 4-byte count"
#: Bytes an entry id takes in a READ_BATCH body; an answer's status and length in a reply.
READ_BATCH_BYTES_PER_ID = 8
READ_ANSWER_BYTES = 8
#: Most entry ids one READ_BATCH carries.
MAX_READS_PER_MESSAGE = 65_535
REPLY_HEADER = struct.Struct(">2sBBiQqH")
_INFO = struct.Struct(">QQB")
assert (REPLY_HEADER.size, _INFO.size) == (26, 17), \
    "reply headers and INFO bodies are documented as 26 and 17 bytes"
_REQUEST_ID = struct.Struct(">Q")
_REQUEST_ID_OFFSET = 8

#: The largest header either side sends.
MAX_HEADER_BYTES = max(REQUEST_HEADER.size, REPLY_HEADER.size) + max(MAX_MASTER_KEY_BYTES,
                                                                     MAX_MESSAGE_BYTES)

#: A received frame: ``bytes``, or a read-only memoryview of the ZeroMQ message it came
#: in (a server's large request bodies: :func:`pybk.net.frames.recv_message`).
Frame = bytes | memoryview

_U64_MAX = 2 ** 64 - 1
_U32_MAX = 2 ** 32 - 1
_I64_MIN, _I64_MAX = -2 ** 63, 2 ** 63 - 1


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    WRITE_LAC = 4
    LONG_POLL = 5
    INFO = 6
    DELETE = 7
    READ_BATCH = 8
    FORCE_LEDGER = 9


#: The operation byte of an error reply to a request that could not be decoded.
UNKNOWN_OP = 0
_ADD = int(Op.ADD)  # a plain int packs without a call to the enum's __index__


class _Body(enum.Enum):
    NONE = "none"
    ADDS = "adds"            # add records (request), statuses (reply)
    ENTRY = "entry"          # always present on success
    OPTIONAL = "optional"    # an entry, or nothing
    INFO = "info"
    READS = "reads"          # entry ids (request), answers (reply)


@dataclass(frozen=True)
class _Spec:
    """What one operation carries (the table of the module docstring)."""

    flags: int = 0                  # flag bits the request may set
    key: bool = False               # the request carries the master key
    entry_id_min: int | None = None  # lowest entry id; None: the field is unused (0)
    lac: bool = False               # the request's LAC field is used
    timeout: bool = False           # the request's timeout field is used
    request_body: bool = False      # the request has a body frame (add records)
    reply_lac: bool = False         # the reply's LAC field is used
    reply_body: _Body = _Body.NONE


_SPECS: dict[int, _Spec] = {  # keyed by Op, an int
    Op.ADD: _Spec(request_body=True, reply_body=_Body.ADDS),
    Op.READ: _Spec(flags=FENCE, key=True, entry_id_min=-1, reply_body=_Body.ENTRY),
    Op.READ_LAC: _Spec(reply_lac=True),
    Op.WRITE_LAC: _Spec(key=True, lac=True),
    Op.LONG_POLL: _Spec(entry_id_min=0, lac=True, timeout=True, reply_lac=True,
                        reply_body=_Body.OPTIONAL),
    Op.INFO: _Spec(reply_body=_Body.INFO),
    Op.DELETE: _Spec(),
    Op.READ_BATCH: _Spec(request_body=True, reply_body=_Body.READS),
    Op.FORCE_LEDGER: _Spec(flags=HELD, entry_id_min=0, lac=True, reply_lac=True),
}
_OPS = {int(op): op for op in Op}


class Request(NamedTuple):
    """A decoded request (fields an operation does not use are 0)."""

    op: Op
    request_id: int
    ledger_id: int = 0
    entry_id: int = 0
    lac: int = 0
    timeout_ms: int = 0
    flags: int = 0
    master_key: bytes = b""
    entry: Frame | None = None

    def required_body(self) -> Frame:
        """The body of a request whose operation has one (ADD, READ_BATCH): there, as
        :func:`decode_request` checked."""
        assert self.entry is not None, f"a {_name(self.op)} request without its body"
        return self.entry


class Reply(NamedTuple):
    """A decoded reply.  ``op`` is an :class:`Op`, or :data:`UNKNOWN_OP` in an error reply
    to an undecodable request."""

    op: int
    request_id: int
    status: int = 0
    lac: int = 0
    message: str = ""
    body: bytes | None = None

    def required_body(self) -> bytes:
        """The body of a success reply whose operation has one: there, as
        :func:`decode_reply` checked."""
        assert self.body is not None, f"a {_name(self.op)} reply without its body"
        return self.body


class AddRun(NamedTuple):
    """One run of an ADD body: adds of one ledger, with one master key, one recovery flag
    and one deferred-sync flag, in body order (``entry_ids[i]`` is ``entries[i]``'s id)."""

    ledger_id: int
    entry_ids: list[int]
    entries: list[Frame]  # decoded: read-only views of the body (decode_adds)
    master_key: bytes
    recovery: bool = False
    deferred: bool = False


class BookieInfo(NamedTuple):
    """What an INFO request answers."""

    free_bytes: int
    total_bytes: int
    read_only: bool


# -- requests -------------------------------------------------------------------------

def encode_request(request: Request, max_entry_bytes: int) -> list[bytes]:
    """The frames of a request (checked as a receiver would check them)."""
    _check_request(request, max_entry_bytes)
    header = REQUEST_HEADER.pack(MAGIC, VERSION, request.op, request.flags,
                                 len(request.master_key), request.request_id,
                                 request.ledger_id, request.entry_id, request.lac,
                                 request.timeout_ms) + request.master_key
    if request.entry is None:
        return [header]
    return [header, bytes(request.entry)]  # the same object if it is bytes (a sender's)


def encode_add_request(request_id: int, runs: Sequence[AddRun | tuple],
                       max_entry_bytes: int) -> list[bytes]:
    """The frames of an ADD request carrying ``runs``: what :func:`encode_request` makes
    of it, without its general checks (a client's hot path: an ADD header holds only the
    request id, and :func:`encode_adds` checks the body as a receiver does)."""
    return [REQUEST_HEADER.pack(MAGIC, VERSION, _ADD, 0, 0, request_id, 0, 0, 0, 0),
            encode_adds(runs, max_entry_bytes)]


def decode_request(frames: Sequence[Frame], max_entry_bytes: int) -> Request:
    """A request from its frames; MalformedMessage (or EntryTooLarge) if they break the
    format."""
    header = _header_frame(frames, REQUEST_HEADER)
    (_, _, op, flags, key_length, request_id, ledger_id, entry_id, lac,
     timeout_ms) = REQUEST_HEADER.unpack_from(header)
    if len(header) != REQUEST_HEADER.size + key_length:
        raise MalformedMessage(f"request header is {len(header)} bytes; its key length "
                               f"{key_length} says {REQUEST_HEADER.size + key_length}")
    spec = _spec(op)
    if len(frames) != 1 + spec.request_body:
        raise MalformedMessage(f"a {_name(op)} request has {1 + spec.request_body} "
                               f"frames, not {len(frames)}")
    request = Request(_OPS[op], request_id, ledger_id, entry_id, lac, timeout_ms, flags,
                      bytes(header[REQUEST_HEADER.size:]),
                      frames[1] if spec.request_body else None)
    _check_request(request, max_entry_bytes)
    return request


def peek_request_id(frames: Sequence[Frame]) -> int | None:
    """The request id of a message that may not decode, if it has one to reply to."""
    if not frames:
        return None
    header = frames[0]
    if len(header) < _REQUEST_ID_OFFSET + _REQUEST_ID.size or header[:2] != MAGIC:
        return None
    return _REQUEST_ID.unpack_from(header, _REQUEST_ID_OFFSET)[0]


def _check_request(r: Request, max_entry_bytes: int) -> None:
    # Plain ifs: messages are only formatted for a request that fails (the hot path).
    spec = _spec(r.op)
    if not (0 <= r.request_id <= _U64_MAX and 0 <= r.ledger_id <= _U64_MAX):
        raise MalformedMessage(f"request id {r.request_id} or ledger id {r.ledger_id} out "
                               "of range")
    if r.flags & ~spec.flags:
        raise MalformedMessage(f"flags {r.flags:#x} not allowed on {_name(r.op)}")
    if len(r.master_key) > MAX_MASTER_KEY_BYTES:
        raise MalformedMessage(f"master key of {len(r.master_key)} bytes is over "
                               f"{MAX_MASTER_KEY_BYTES}")
    if r.master_key and not (spec.key and (r.op != Op.READ or r.flags & FENCE)):
        raise MalformedMessage(f"{_name(r.op)} carries no master key here")
    if not (spec.entry_id_min is None and r.entry_id == 0
            or spec.entry_id_min is not None and spec.entry_id_min <= r.entry_id <= _I64_MAX):
        raise MalformedMessage(f"entry id {r.entry_id} not allowed on {_name(r.op)}")
    if not (-1 <= r.lac <= _I64_MAX if spec.lac else r.lac == 0):
        raise MalformedMessage(f"LAC {r.lac} not allowed on {_name(r.op)}")
    if r.op == Op.FORCE_LEDGER and not (r.entry_id - 1 <= r.lac if r.flags & HELD
                                        else r.entry_id == r.lac == 0):
        raise MalformedMessage(f"a FORCE_LEDGER range {r.entry_id}..{r.lac} without HELD, "
                               "or empty by more than one")
    if not (1 <= r.timeout_ms <= MAX_LONG_POLL_MS if spec.timeout else r.timeout_ms == 0):
        raise MalformedMessage(f"timeout {r.timeout_ms} ms not allowed on {_name(r.op)} "
                               f"(long polls: 1..{MAX_LONG_POLL_MS})")
    if (r.entry is not None) != spec.request_body:
        raise MalformedMessage(f"{_name(r.op)} carries "
                               f"{'an entry' if spec.request_body else 'no entry'}")
    if r.entry is not None and len(r.entry) > max_add_body_bytes(max_entry_bytes):
        raise EntryTooLarge(f"{_name(r.op)} body of {len(r.entry)} bytes is over "
                            f"{max_add_body_bytes(max_entry_bytes)}")


# -- replies ----------------------------------------------------------------------------

def encode_reply(reply: Reply, max_entry_bytes: int) -> list[bytes]:
    """The frames of a reply (checked as a receiver would check them)."""
    _check_reply(reply, max_entry_bytes)
    message = _utf8_prefix(reply.message, MAX_MESSAGE_BYTES) if reply.message else b""
    header = REPLY_HEADER.pack(MAGIC, VERSION, reply.op, reply.status, reply.request_id,
                               reply.lac, len(message)) + message
    if reply.body is None:
        return [header]
    return [header, reply.body]


def error_code(error: BaseException) -> int:
    """The status that carries ``error``: its pybk code, or the base code for a stranger."""
    return error.code if isinstance(error, BookKeeperError) else BookKeeperError.code


def error_reply(op: int, request_id: int, error: BaseException) -> Reply:
    """The reply that carries ``error``."""
    return Reply(op, request_id, status=error_code(error),
                 message=f"{type(error).__name__}: {error}")


def decode_reply(frames: Sequence[bytes], max_entry_bytes: int) -> Reply:
    """A reply from its frames; MalformedMessage (or EntryTooLarge) if they break the
    format."""
    header = _header_frame(frames, REPLY_HEADER)
    _, _, op, status, request_id, lac, message_length = REPLY_HEADER.unpack_from(header)
    if len(header) != REPLY_HEADER.size + message_length:
        raise MalformedMessage(f"reply header is {len(header)} bytes; its message length "
                               f"{message_length} says {REPLY_HEADER.size + message_length}")
    if message_length > MAX_MESSAGE_BYTES:
        raise MalformedMessage(f"reply message of {message_length} bytes is over "
                               f"{MAX_MESSAGE_BYTES}")
    if len(frames) > 2:
        raise MalformedMessage(f"a reply has 1 or 2 frames, not {len(frames)}")
    try:
        message = bytes(header[REPLY_HEADER.size:]).decode() if message_length else ""
    except UnicodeDecodeError:
        raise MalformedMessage("reply message is not UTF-8") from None
    reply = Reply(op if op == UNKNOWN_OP else _op(op), request_id, status, lac, message,
                  bytes(frames[1]) if len(frames) == 2 else None)
    _check_reply(reply, max_entry_bytes)
    return reply


def _check_reply(r: Reply, max_entry_bytes: int) -> None:
    if not (0 <= r.request_id <= _U64_MAX and _I64_MIN <= r.lac <= _I64_MAX):
        raise MalformedMessage(f"request id {r.request_id} or LAC {r.lac} out of range")
    if r.status != 0:
        if not -2 ** 31 <= r.status < 2 ** 31:
            raise MalformedMessage(f"status {r.status} out of range")
        if r.op != UNKNOWN_OP:
            _spec(r.op)
        if r.body is not None or r.lac != 0:
            raise MalformedMessage("an error reply carries no body or LAC")
        return
    spec = _spec(r.op)
    if r.message and spec.reply_body is not _Body.ADDS:
        raise MalformedMessage("a success reply carries no message")
    if r.lac != 0 and not spec.reply_lac:
        raise MalformedMessage(f"a {_name(r.op)} reply has no LAC (got {r.lac})")
    body = spec.reply_body
    if r.body is None:
        if body is not _Body.NONE and body is not _Body.OPTIONAL:
            raise MalformedMessage(f"a {_name(r.op)} reply needs a body")
    elif body is _Body.NONE:
        raise MalformedMessage(f"a {_name(r.op)} reply has no body")
    elif body is _Body.INFO:
        decode_info(r.body)
    elif body is _Body.ADDS:
        if len(r.body) % _ADD_STATUS.size or len(r.body) > max_add_body_bytes(max_entry_bytes):
            raise MalformedMessage(f"an ADD reply body of {len(r.body)} bytes is not a "
                                   "whole number of statuses within the body limit")
    elif body is _Body.READS:
        if len(r.body) > max_add_body_bytes(max_entry_bytes):
            raise MalformedMessage(f"a READ_BATCH reply body of {len(r.body)} bytes is over "
                                   f"the body limit {max_add_body_bytes(max_entry_bytes)}")
    else:
        _check_size(r.body, max_entry_bytes)


# -- add batches -----------------------------------------------------------------------

def max_add_body_bytes(max_entry_bytes: int) -> int:
    """The largest ADD body for a receiver of entries up to ``max_entry_bytes``."""
    return (ADD_COUNT.size + RUN_HEADER.size + MAX_MASTER_KEY_BYTES + RUN_BYTES_PER_ADD
            + max_entry_bytes)


def encode_adds(runs: Sequence[AddRun | tuple], max_entry_bytes: int) -> bytes:
    """The body of an ADD request carrying ``runs`` (:class:`AddRun` or plain tuples of
    its fields), checked as a receiver checks it."""
    count = sum(len(run[1]) for run in runs)
    if not runs or count > MAX_ADDS_PER_MESSAGE:
        raise MalformedMessage(f"an ADD carries 1..{MAX_ADDS_PER_MESSAGE} adds, not "
                               f"{count}")
    # One pack per run: its header, key, entry ids and lengths (the first run's with the
    # body's count before them), then its entries as they are.
    parts: list[Frame] = []
    count_format, count_fields = ADD_COUNT.format, [len(runs)]
    for ledger_id, entry_ids, entries, key, recovery, *deferred in runs:
        n = len(entry_ids)
        lengths = list(map(len, entries))
        if n == 0 or n != len(entries) or len(key) > MAX_MASTER_KEY_BYTES \
                or not 0 <= ledger_id <= _U64_MAX:
            raise MalformedMessage(f"a run of ledger {ledger_id} with {n} entry ids, "
                                   f"{len(entries)} entries and a {len(key)}-byte key "
                                   "does not fit the format")
        if max(lengths) > max_entry_bytes:
            raise EntryTooLarge(f"entry of {max(lengths)} bytes is over the maximum of "
                                f"{max_entry_bytes}")
        if min(entry_ids) < 0 or max(entry_ids) > _I64_MAX:
            raise MalformedMessage(f"a run of ledger {ledger_id} has an entry id out of "
                                   "range")
        flags = (RECOVERY if recovery else 0) | (DEFERRED_SYNC if any(deferred) else 0)
        parts.append(struct.pack(f"{count_format}{_RUN_FIELDS}{len(key)}s{n}q{n}I",
                                 *count_fields, ledger_id, flags, len(key), n, key,
                                 *entry_ids, *lengths))
        parts += entries
        count_format, count_fields = ">", []
    body = b"".join(parts)
    if len(body) > max_add_body_bytes(max_entry_bytes):
        raise EntryTooLarge(f"ADD body of {len(body)} bytes is over "
                            f"{max_add_body_bytes(max_entry_bytes)}")
    return body


#: The mean entry size below which :func:`decode_adds` copies a body's entries: a
#: memoryview takes 184 bytes against a bytes object's 33 plus its length, so views of
#: entries of a few dozen bytes held in a write cache cost about four times copies (and
#: at 1 KiB, views and copies measured the same CPU per add).
VIEW_MIN_MEAN_BYTES = 512


def decode_adds(body: Frame, max_entry_bytes: int) -> list[AddRun]:
    """The runs of an ADD body; MalformedMessage (or EntryTooLarge) if it breaks the
    format.

    The entries are read-only memoryviews of ``body``, cut in C, not copies: they keep
    ``body`` alive as long as any of them is held (a bookie's write cache holds a
    message's entries until its next checkpoint).  So that what they keep alive is at
    most twice what they are, a body whose entries are less than half of it gets
    ``bytes`` copies instead, and so does one whose entries average under
    :data:`VIEW_MIN_MEAN_BYTES`.  Master keys are copied (``bytes``)."""
    if len(body) < ADD_COUNT.size:
        raise MalformedMessage(f"ADD body of {len(body)} bytes has no count")
    count, = ADD_COUNT.unpack_from(body)
    if not 1 <= count <= MAX_ADDS_PER_MESSAGE:
        raise MalformedMessage(f"an ADD carries 1..{MAX_ADDS_PER_MESSAGE} runs, not {count}")
    runs: list[AddRun] = []
    offset, end, adds, entry_bytes = ADD_COUNT.size, len(body), 0, 0
    cut = memoryview(body).toreadonly().__getitem__
    for _ in range(count):
        if offset + RUN_HEADER.size > end:
            raise MalformedMessage(f"ADD body ends inside run {len(runs)}")
        ledger_id, flags, key_length, n = RUN_HEADER.unpack_from(body, offset)
        key_at = offset + RUN_HEADER.size
        ids_at = key_at + key_length
        adds += n
        if flags & ~(RECOVERY | DEFERRED_SYNC) or key_length > MAX_MASTER_KEY_BYTES or n == 0 \
                or adds > MAX_ADDS_PER_MESSAGE:
            raise MalformedMessage(f"run {len(runs)} (ledger {ledger_id}, flags {flags:#x}, "
                                   f"key of {key_length} bytes, {n} adds) is out of range")
        entries_at = ids_at + RUN_BYTES_PER_ADD * n
        if entries_at > end:
            raise MalformedMessage(f"ADD body ends inside run {len(runs)}")
        numbers = struct.unpack_from(f">{n}q{n}I", body, ids_at)
        entry_ids, lengths = list(numbers[:n]), numbers[n:]
        if min(entry_ids) < 0:
            raise MalformedMessage(f"run {len(runs)} (ledger {ledger_id}) has a negative "
                                   "entry id")
        if max(lengths) > max_entry_bytes:
            raise EntryTooLarge(f"entry of {max(lengths)} bytes is over the maximum of "
                                f"{max_entry_bytes}")
        ends = list(itertools.accumulate(lengths, initial=entries_at))
        offset = ends[-1]
        if offset > end:
            raise MalformedMessage(f"ADD body ends inside run {len(runs)}")
        entry_bytes += offset - entries_at
        runs.append(AddRun(ledger_id, entry_ids,
                           list(map(cut, map(slice, ends, itertools.islice(ends, 1, None)))),
                           bytes(body[key_at:ids_at]), bool(flags & RECOVERY),
                           bool(flags & DEFERRED_SYNC)))
    if offset != end:
        raise MalformedMessage(f"ADD body has {end - offset} bytes after its {count} runs")
    if 2 * entry_bytes < end or entry_bytes < VIEW_MIN_MEAN_BYTES * adds:
        # Mostly keys, ids and lengths (a run per add with a long master key: up to 40
        # times its entries): views would keep the whole body alive for what a bookie's
        # write cache counts as its entries only, so it gets copies of them instead.
        # Small entries too: a view object costs more than a small bytes object.
        for run in runs:
            run.entries[:] = map(bytes, run.entries)
    return runs


def encode_add_statuses(statuses: Sequence[int]) -> bytes:
    """The body of an ADD reply: one status per add (0: durable, else an error code)."""
    if not any(statuses):
        return bytes(_ADD_STATUS.size * len(statuses))
    return b"".join(_ADD_STATUS.pack(status) for status in statuses)


def encode_adds_durable(request_id: int, count: int) -> list[bytes]:
    """The frames of the reply to an ADD of ``count`` adds that all succeeded: what
    :func:`encode_reply` makes of it, without its general checks (a server's hot path).
    """
    return [REPLY_HEADER.pack(MAGIC, VERSION, Op.ADD, 0, request_id, 0, 0),
            bytes(_ADD_STATUS.size * count)]


def decode_add_statuses(body: bytes, count: int) -> list[int] | None:
    """The statuses of an ADD reply to ``count`` adds, or None if every add succeeded;
    MalformedMessage if the body does not hold ``count`` statuses."""
    if len(body) != _ADD_STATUS.size * count:
        raise MalformedMessage(f"an ADD reply to {count} adds carries "
                               f"{len(body) // _ADD_STATUS.size} statuses")
    if not any(body):
        return None
    return [status for status, in _ADD_STATUS.iter_unpack(body)]


# -- batch reads -------------------------------------------------------------------------

def max_read_batch_ids(max_entry_bytes: int) -> int:
    """The most entry ids a READ_BATCH to a receiver of ``max_entry_bytes`` carries."""
    return min(MAX_READS_PER_MESSAGE, (max_add_body_bytes(max_entry_bytes)
                                       - READ_BATCH_HEADER.size) // READ_BATCH_BYTES_PER_ID)


def encode_read_batch(entry_ids: Sequence[int], max_bytes: int) -> bytes:
    """The body of a READ_BATCH request, checked as a receiver checks it."""
    n = len(entry_ids)
    if not 1 <= n <= MAX_READS_PER_MESSAGE or not 1 <= max_bytes <= _U32_MAX:
        raise MalformedMessage(f"a READ_BATCH asks for 1..{MAX_READS_PER_MESSAGE} entries "
                               f"and 1..{_U32_MAX} bytes, not {n} and {max_bytes}")
    if min(entry_ids) < 0 or max(entry_ids) > _I64_MAX:
        raise MalformedMessage("a READ_BATCH has an entry id out of range")
    return READ_BATCH_HEADER.pack(n, max_bytes) + struct.pack(f">{n}q", *entry_ids)


def decode_read_batch(body: Frame) -> tuple[list[int], int]:
    """``(entry ids, most bytes of entries)`` of a READ_BATCH body; MalformedMessage if it
    breaks the format."""
    if len(body) < READ_BATCH_HEADER.size:
        raise MalformedMessage(f"READ_BATCH body of {len(body)} bytes has no header")
    n, max_bytes = READ_BATCH_HEADER.unpack_from(body)
    if not 1 <= n <= MAX_READS_PER_MESSAGE or max_bytes < 1:
        raise MalformedMessage(f"a READ_BATCH asks for 1..{MAX_READS_PER_MESSAGE} entries "
                               f"and at least 1 byte, not {n} and {max_bytes}")
    if len(body) != READ_BATCH_HEADER.size + READ_BATCH_BYTES_PER_ID * n:
        raise MalformedMessage(f"READ_BATCH body of {len(body)} bytes does not hold {n} "
                               "entry ids")
    entry_ids = list(struct.unpack_from(f">{n}q", body, READ_BATCH_HEADER.size))
    if min(entry_ids) < 0:
        raise MalformedMessage("a READ_BATCH has a negative entry id")
    return entry_ids, max_bytes


def encode_read_answers(statuses: Sequence[int], entries: Sequence[bytes],
                        max_entry_bytes: int) -> bytes:
    """The body of a READ_BATCH reply: ``statuses[i]`` is 0 and ``entries[i]`` the entry,
    or ``statuses[i]`` an error code and ``entries[i]`` empty."""
    n = len(statuses)
    lengths = list(map(len, entries))
    if not 1 <= n <= MAX_READS_PER_MESSAGE or len(entries) != n \
            or any(status and length for status, length in zip(statuses, lengths)):
        raise MalformedMessage(f"a READ_BATCH reply of {n} statuses and {len(entries)} "
                               "entries (none for a failed read) does not fit the format")
    if max(lengths) > max_entry_bytes:
        raise EntryTooLarge(f"entry of {max(lengths)} bytes is over the maximum of "
                            f"{max_entry_bytes}")
    body = b"".join((READ_ANSWERS_COUNT.pack(n), struct.pack(f">{n}i{n}I", *statuses,
                                                             *lengths), *entries))
    if len(body) > max_add_body_bytes(max_entry_bytes):
        raise EntryTooLarge(f"READ_BATCH reply body of {len(body)} bytes is over "
                            f"{max_add_body_bytes(max_entry_bytes)}")
    return body


def decode_read_answers(body: bytes, asked: int,
                        max_entry_bytes: int) -> tuple[list[int], list[bytes]]:
    """``(statuses, entries)`` of a READ_BATCH reply to a request for ``asked`` entries;
    MalformedMessage (or EntryTooLarge) if it breaks the format."""
    if len(body) < READ_ANSWERS_COUNT.size:
        raise MalformedMessage(f"READ_BATCH reply body of {len(body)} bytes has no count")
    n, = READ_ANSWERS_COUNT.unpack_from(body)
    entries_at = READ_ANSWERS_COUNT.size + READ_ANSWER_BYTES * n
    if not 1 <= n <= asked or entries_at > len(body):
        raise MalformedMessage(f"a READ_BATCH reply to {asked} entry ids carries {n} "
                               f"answers in {len(body)} bytes")
    numbers = struct.unpack_from(f">{n}i{n}I", body, READ_ANSWERS_COUNT.size)
    statuses, lengths = list(numbers[:n]), numbers[n:]
    if max(lengths) > max_entry_bytes:
        raise EntryTooLarge(f"entry of {max(lengths)} bytes is over the maximum of "
                            f"{max_entry_bytes}")
    if any(status and length for status, length in zip(statuses, lengths)):
        raise MalformedMessage("a READ_BATCH reply carries an entry for a failed read")
    ends = list(itertools.accumulate(lengths, initial=entries_at))
    if ends[-1] != len(body):
        raise MalformedMessage(f"READ_BATCH reply body of {len(body)} bytes does not hold "
                               f"entries of {ends[-1] - entries_at} bytes after {n} answers")
    return statuses, [body[a:b] for a, b in zip(ends, itertools.islice(ends, 1, None))]


def encode_info(info: BookieInfo) -> bytes:
    """The body of an INFO reply."""
    return _INFO.pack(info.free_bytes, info.total_bytes, int(info.read_only))


def decode_info(body: bytes) -> BookieInfo:
    """An INFO reply's body; MalformedMessage if it is not 17 bytes with a 0/1 flag."""
    if len(body) != _INFO.size:
        raise MalformedMessage(f"an INFO body is {_INFO.size} bytes, not {len(body)}")
    free, total, read_only = _INFO.unpack(body)
    if read_only not in (0, 1):
        raise MalformedMessage(f"read-only flag {read_only} is not 0 or 1")
    return BookieInfo(free, total, bool(read_only))


# -- shared checks ----------------------------------------------------------------------

def _header_frame(frames: Sequence[Frame], fixed: struct.Struct) -> Frame:
    if not frames:
        raise MalformedMessage("empty message")
    header = frames[0]
    if len(header) < fixed.size:
        raise MalformedMessage(f"header of {len(header)} bytes is shorter than {fixed.size}")
    if header[:2] != MAGIC:
        raise MalformedMessage(f"bad magic {bytes(header[:2])!r}: not a pybk message")
    if header[2] != VERSION:
        raise MalformedMessage(f"protocol version {header[2]} is not supported (this side "
                               f"speaks {VERSION})")
    return header


def _op(code: int) -> Op:
    op = _OPS.get(code)
    if op is None:
        raise MalformedMessage(f"unknown operation {code}")
    return op


def _spec(code: int) -> _Spec:
    spec = _SPECS.get(code)  # an IntEnum hashes as its int
    if spec is None:
        raise MalformedMessage(f"unknown operation {code}")
    return spec


def _name(code: int) -> str:
    return _OPS[code].name


def _check_size(entry: bytes, max_entry_bytes: int) -> None:
    if len(entry) > max_entry_bytes:
        raise EntryTooLarge(f"entry of {len(entry)} bytes is over the maximum of "
                            f"{max_entry_bytes}")


def _utf8_prefix(text: str, limit: int) -> bytes:
    """``text`` as UTF-8, cut to at most ``limit`` bytes without splitting a character."""
    data = text.encode()
    if len(data) <= limit:
        return data
    return data[:limit].decode(errors="ignore").encode()


def zmq_max_message_bytes(max_entry_bytes: int) -> int:
    """The ZeroMQ ``MAXMSGSIZE`` for a socket receiving entries of ``max_entry_bytes``.

    Twice the largest legal frame: a peer that misjudged the entry limit gets a clean
    EntryTooLarge, while a far larger frame (a broken or hostile peer) makes ZeroMQ drop
    the connection before buffering it, which bounds the memory a peer can take.
    """
    return 2 * (max_entry_bytes + MAX_HEADER_BYTES)
