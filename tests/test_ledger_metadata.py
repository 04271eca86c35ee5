"""Ledger metadata (pybk.meta.ledger_metadata) and the ledger manager over a store
(pybk.meta.ledgers): write sets, validation, the serialized format, rejection of damaged
or unknown input, and compare-and-set of ledger records."""

from __future__ import annotations

import dataclasses
import json
import queue
import random
import struct

import pytest

from pybk.checksum import crc32c
from pybk.errors import (
    BadVersion,
    InvalidLedgerMetadata,
    MalformedMetadata,
    NoSuchLedger,
    error_for_code,
)
from pybk.meta import (
    DigestType,
    EmbeddedMetadataStore,
    Fragment,
    LedgerManager,
    LedgerMetadata,
    LedgerState,
    hash_password,
)
from pybk.meta.layout import FLAT
from pybk.meta.ledger_metadata import MAGIC, PASSWORD_HASH_BYTES
from pybk.meta.sealed import HEADER

pytestmark = pytest.mark.timeout(60)

B = ("B1", "B2", "B3", "B4")


def metadata(**overrides) -> LedgerMetadata:
    fields = dict(ledger_id=7, ensemble_size=4, write_quorum_size=3, ack_quorum_size=2,
                  fragments=((0, B),), digest_type=DigestType.CRC32C,
                  password_hash=hash_password(b"secret"), creation_time_ms=1700000000000)
    fields.update(overrides)
    return LedgerMetadata(**fields)


def closed_with_two_fragments() -> LedgerMetadata:
    return metadata(ensemble_size=3, write_quorum_size=2,
                    fragments=((0, ("b1:3181", "b2:3181", "b3:3181")),
                               (42, ("b1:3181", "b4:3181", "b3:3181"))),
                    password_hash=bytes(range(PASSWORD_HASH_BYTES)),
                    state=LedgerState.CLOSED, last_entry_id=99, length=12345,
                    custom_metadata={"app": b"\xff\x00", "name": b"orders"})


# The format, frozen: this is what version 1 of the format looks like for the metadata
# above.  If it changes, readers of existing records break: add a format version instead.
GOLDEN = (
    b'PBKL\x00\x02\x00\x00\x01\xaa\xe6\xf4K\xa8{"ack_quorum_size":2,"creation_time_ms":'
    b'1700000000000,"custom_metadata":{"app":"/wA=","name":"b3JkZXJz"},"digest_type":'
    b'"CRC32C","ensemble_size":3,"fragments":[[0,["b1:3181","b2:3181","b3:3181"]],[42,'
    b'["b1:3181","b4:3181","b3:3181"]]],"last_entry_id":99,"ledger_id":7,"length":12345,'
    b'"mac_key_prefix":"mac",'
    b'"password_hash":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4v",'
    b'"state":"CLOSED","write_quorum_size":2}')
#: The same ledger in format version 1 (pybk before the MAC key was BookKeeper's).
GOLDEN_V1 = (
    b'PBKL\x00\x01\x00\x00\x01\x93\x1c\x12\xc5\xaf{"ack_quorum_size":2,"creation_time_ms":'
    b'1700000000000,"custom_metadata":{"app":"/wA=","name":"b3JkZXJz"},"digest_type":'
    b'"CRC32C","ensemble_size":3,"fragments":[[0,["b1:3181","b2:3181","b3:3181"]],[42,'
    b'["b1:3181","b4:3181","b3:3181"]]],"last_entry_id":99,"ledger_id":7,"length":12345,'
    b'"password_hash":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4v",'
    b'"state":"CLOSED","write_quorum_size":2}')


# -- write sets ---------------------------------------------------------------------------

@pytest.mark.parametrize("entry_id, expected", [
    (0, ("B1", "B2", "B3")), (1, ("B2", "B3", "B4")), (2, ("B3", "B4", "B1")),
    (3, ("B4", "B1", "B2")), (4, ("B1", "B2", "B3")), (5, ("B2", "B3", "B4")),
    (1_000_003, ("B4", "B1", "B2")),
])
def test_write_set_is_qw_bookies_from_entry_mod_e_wrapping(entry_id, expected):
    assert metadata().write_set(entry_id) == expected


def test_write_set_follows_the_fragment_of_the_entry():
    md = metadata(fragments=((0, B), (10, ("B1", "B5", "B3", "B4")),
                             (20, ("C1", "C2", "C3", "C4"))))
    assert md.ensemble_at(9) == B
    assert md.ensemble_at(10) == ("B1", "B5", "B3", "B4")
    assert md.ensemble_at(19) == ("B1", "B5", "B3", "B4")
    assert md.ensemble_at(10**9) == ("C1", "C2", "C3", "C4")
    assert md.write_set(9) == ("B2", "B3", "B4")
    assert md.write_set(13) == ("B5", "B3", "B4")
    assert md.write_set(21) == ("C2", "C3", "C4")
    with pytest.raises(ValueError):
        md.ensemble_at(-1)


def test_write_quorum_equal_to_ensemble_is_every_bookie():
    md = metadata(ensemble_size=3, write_quorum_size=3, fragments=((0, B[:3]),))
    assert [md.write_set(e) for e in range(3)] == [
        ("B1", "B2", "B3"), ("B2", "B3", "B1"), ("B3", "B1", "B2")]


# -- validation --------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(write_quorum_size=5), "ensemble size >= write quorum"),
    (dict(ack_quorum_size=4), "write quorum >= ack quorum"),
    (dict(ack_quorum_size=0), "ack_quorum_size"),
    (dict(ensemble_size=0), "ensemble_size"),
    (dict(write_quorum_size=True), "write_quorum_size"),
    (dict(ledger_id=-1), "ledger_id"),
    (dict(ledger_id=1 << 63), "ledger_id"),
    (dict(ledger_id=7.0), "ledger_id"),
    (dict(fragments=()), "begin with one at entry 0"),
    (dict(fragments=((1, B),)), "begin with one at entry 0"),
    (dict(fragments=((0, B), (5, B), (5, B))), "increasing"),
    (dict(fragments=((0, B), (5, B), (3, B))), "increasing"),
    (dict(fragments=((0, B[:3]),)), "4 distinct"),
    (dict(fragments=((0, ("B1", "B1", "B2", "B3")),)), "4 distinct"),
    (dict(fragments=((0, ("B1", "", "B2", "B3")),)), "non-empty"),
    (dict(fragments=((0, "B1B2"),)), "sequence of bookie ids"),
    (dict(fragments=((0,),)), "first entry id"),
    (dict(fragments=((-1, B),)), "first entry id"),
    (dict(state="OPEN"), "LedgerState"),
    (dict(digest_type="CRC32"), "DigestType"),
    (dict(state=LedgerState.CLOSED), "last_entry_id of a closed ledger"),
    (dict(state=LedgerState.CLOSED, last_entry_id=-2, length=0), "last_entry_id"),
    (dict(state=LedgerState.CLOSED, last_entry_id=-1, length=5), "length 0"),
    (dict(state=LedgerState.CLOSED, last_entry_id=3), "length of a closed ledger"),
    (dict(state=LedgerState.OPEN, last_entry_id=3, length=10), "no last entry id"),
    (dict(state=LedgerState.IN_RECOVERY, last_entry_id=3, length=10), "no last entry id"),
    (dict(password_hash=b"secret"), "never the password"),
    (dict(creation_time_ms=-5), "creation_time_ms"),
    (dict(custom_metadata={"k": "text"}), "str to bytes"),
    (dict(custom_metadata={1: b"v"}), "str to bytes"),
    (dict(custom_metadata=[("k", b"v")]), "mapping"),
])
def test_invalid_metadata_is_refused_with_a_clear_error(overrides, message):
    with pytest.raises(InvalidLedgerMetadata, match=message):
        metadata(**overrides)


def test_invalid_metadata_error_is_a_value_error_with_a_bookkeeper_code():
    with pytest.raises(ValueError) as info:
        metadata(write_quorum_size=1, ack_quorum_size=2)
    assert isinstance(error_for_code(info.value.code, "x"), InvalidLedgerMetadata)


def test_metadata_is_immutable_and_replace_validates_again():
    custom = {"k": b"v"}
    md = metadata(custom_metadata=custom)
    custom["k"] = b"changed"
    assert md.custom_metadata == {"k": b"v"}
    with pytest.raises(TypeError):
        md.custom_metadata["k"] = b"x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        md.state = LedgerState.CLOSED  # type: ignore[misc]
    closed = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=10, length=100)
    assert closed.state is LedgerState.CLOSED and md.state is LedgerState.OPEN
    with pytest.raises(InvalidLedgerMetadata):
        dataclasses.replace(md, state=LedgerState.CLOSED)
    assert isinstance(md.fragments[0], Fragment) and md.fragments[0].ensemble == B
    assert hash(md) == hash(dataclasses.replace(md, custom_metadata={}))


def test_password_is_stored_only_as_a_salted_hash():
    md = metadata(password_hash=hash_password(b"secret"))
    assert md.check_password(b"secret")
    assert not md.check_password(b"Secret") and not md.check_password(b"")
    assert hash_password(b"secret") != hash_password(b"secret")  # salted
    assert b"secret" not in md.to_bytes() and b"secret" not in repr(md).encode()
    assert metadata(password_hash=hash_password(b"")).check_password(b"")


def test_password_hash_with_a_given_salt_is_reproducible():
    salt = bytes(range(16))
    hashed = hash_password(b"secret", salt=salt)
    assert hashed == hash_password(b"secret", salt=salt) and hashed[:16] == salt
    assert metadata(password_hash=hashed).check_password(b"secret")
    with pytest.raises(ValueError, match="16 bytes"):
        hash_password(b"secret", salt=b"short")


# -- serialization ---------------------------------------------------------------------------

@pytest.mark.parametrize("md", [
    metadata(),
    metadata(state=LedgerState.IN_RECOVERY, digest_type=DigestType.MAC),
    metadata(state=LedgerState.CLOSED, last_entry_id=-1, length=0,
             digest_type=DigestType.DUMMY, ledger_id=(1 << 63) - 1),
    closed_with_two_fragments(),
    metadata(custom_metadata={"": b"", "ünïcode ✓": bytes(range(256)), "z": b"\x00" * 1000},
             fragments=((0, B), (1, ("B1", "B2", "B3", "é:1")), (10**12, ("x", "y", "z", "w"))),
             digest_type=DigestType.CRC32),
])
def test_round_trip(md):
    data = md.to_bytes()
    back = LedgerMetadata.from_bytes(data)
    assert back == md
    assert dict(back.custom_metadata) == dict(md.custom_metadata)
    assert back.to_bytes() == data  # deterministic
    assert LedgerMetadata.from_bytes(memoryview(data)) == md


def test_the_format_matches_the_golden_record():
    assert closed_with_two_fragments().to_bytes() == GOLDEN
    assert LedgerMetadata.from_bytes(GOLDEN) == closed_with_two_fragments()


def test_a_format_1_record_is_read_with_the_mac_key_it_was_written_with():
    assert LedgerMetadata.from_bytes(GOLDEN_V1) == dataclasses.replace(
        closed_with_two_fragments(), mac_key_prefix="ledger")
    with pytest.raises(MalformedMetadata, match="exactly the keys"):  # format 2's key in 1
        LedgerMetadata.from_bytes(frame(GOLDEN[HEADER.size:], version=1))
    with pytest.raises(InvalidLedgerMetadata, match="mac_key_prefix"):
        dataclasses.replace(closed_with_two_fragments(), mac_key_prefix="other")


def frame(body: bytes, version: int = 2, magic: bytes = MAGIC) -> bytes:
    """A record with a correct header around ``body`` (so only the body is wrong)."""
    return HEADER.pack(magic, version, len(body), crc32c(body)) + body


def golden_body() -> dict:
    return json.loads(GOLDEN[HEADER.size:])


def test_unknown_format_version_and_magic_are_rejected_clearly():
    body = GOLDEN[HEADER.size:]
    with pytest.raises(MalformedMetadata, match="format version 3.*upgrade"):
        LedgerMetadata.from_bytes(frame(body, version=3))
    with pytest.raises(MalformedMetadata, match="format version 0"):
        LedgerMetadata.from_bytes(frame(body, version=0))
    with pytest.raises(MalformedMetadata, match="not pybk ledger metadata"):
        LedgerMetadata.from_bytes(frame(body, magic=b"BKLM"))
    with pytest.raises(MalformedMetadata, match="shorter than"):
        LedgerMetadata.from_bytes(b"PBKL")


def test_every_truncation_and_every_byte_flip_is_rejected():
    for length in range(len(GOLDEN)):
        with pytest.raises(MalformedMetadata):
            LedgerMetadata.from_bytes(GOLDEN[:length])
    with pytest.raises(MalformedMetadata, match="truncated or padded"):
        LedgerMetadata.from_bytes(GOLDEN + b" ")
    for position in range(len(GOLDEN)):
        damaged = bytearray(GOLDEN)
        damaged[position] ^= 0x20
        with pytest.raises(MalformedMetadata):
            LedgerMetadata.from_bytes(bytes(damaged))


def test_random_garbage_is_rejected_never_crashes():
    rng = random.Random(7)
    for _ in range(2000):
        garbage = rng.randbytes(rng.randrange(0, 200))
        if rng.random() < 0.5:
            garbage = frame(garbage)
        with pytest.raises(MalformedMetadata):
            LedgerMetadata.from_bytes(garbage)


def _with(**changes) -> bytes:
    body = golden_body()
    for key, value in changes.items():
        if value is _DROP:
            del body[key]
        else:
            body[key] = value
    return json.dumps(body).encode()


_DROP = object()


@pytest.mark.parametrize("body, message", [
    (b"\xff\xfe", "malformed"),
    (b"{", "malformed"),
    (b"[1, 2]", "exactly the keys"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed"),
    (_with(extra=1), "exactly the keys"),
    (_with(state=_DROP), "exactly the keys"),
    (_with(ledger_id="7"), "ledger_id is '7'"),
    (_with(ledger_id=7.0), "ledger_id"),
    (_with(ensemble_size=True), "ensemble_size"),
    (_with(state="DELETED"), "DELETED"),
    (_with(digest_type="SHA1"), "SHA1"),
    (_with(password_hash="not base64!"), "malformed"),
    (_with(password_hash="AAAA"), "never the password"),
    (_with(custom_metadata={"k": 5}), "custom_metadata"),
    (_with(custom_metadata=[]), "custom_metadata"),
    (_with(fragments=[[0, "b1"]]), "an ensemble"),
    (_with(fragments=[[0]]), "a fragment is"),
    (_with(fragments=[{"0": []}]), "a fragment is"),
    (_with(fragments=[[0, [1, 2, 3]]]), "a bookie id"),
    (_with(fragments=[]), "entry 0"),
    (_with(write_quorum_size=4), "write quorum"),
    (_with(last_entry_id=None), "last_entry_id"),
    (_with(mac_key_prefix="sha"), "mac_key_prefix"),
    (_with(mac_key_prefix=_DROP), "exactly the keys"),
])
def test_malformed_bodies_are_rejected_with_a_reason(body, message):
    with pytest.raises(MalformedMetadata, match=message):
        LedgerMetadata.from_bytes(frame(body))


# -- the ledger manager over a store ------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        yield store


@pytest.fixture
def ledgers(store):
    return LedgerManager(store)


def test_create_read_update_delete(ledgers):
    created = ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"pw", {"name": b"orders"})
    md, version = created
    assert version == 0 and md.state is LedgerState.OPEN
    assert md.fragments == (Fragment(0, B),) and md.ensemble_size == 4
    assert md.check_password(b"pw") and md.custom_metadata == {"name": b"orders"}
    assert ledgers.read(md.ledger_id) == created
    closed = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=9, length=90)
    assert ledgers.update(closed, 0) == 1
    assert ledgers.read(md.ledger_id) == (closed, 1)
    ledgers.delete(md.ledger_id, 1)
    with pytest.raises(NoSuchLedger):
        ledgers.read(md.ledger_id)
    assert ledgers.ledger_ids() == []


def test_a_stale_update_or_delete_raises_bad_version(ledgers):
    md, version = ledgers.create_ledger(B, 3, 3, DigestType.CRC32, b"")
    recovering = dataclasses.replace(md, state=LedgerState.IN_RECOVERY)
    assert ledgers.update(recovering, version) == 1
    # a writer that still holds version 0 tries to change the ensemble
    changed = dataclasses.replace(md, fragments=(*md.fragments, (5, ("B1", "B2", "B3", "B5"))))
    with pytest.raises(BadVersion):
        ledgers.update(changed, version)
    with pytest.raises(BadVersion):
        ledgers.delete(md.ledger_id, version)
    assert ledgers.read(md.ledger_id) == (recovering, 1)


def test_missing_ledgers_raise_no_such_ledger(ledgers):
    with pytest.raises(NoSuchLedger):
        ledgers.read(12345)
    with pytest.raises(NoSuchLedger):
        ledgers.delete(12345)
    with pytest.raises(NoSuchLedger):
        ledgers.update(metadata(ledger_id=12345), 0)


def test_ids_are_fresh_and_listed_in_order(ledgers, store):
    created = [ledgers.create_ledger(B[:2], 2, 1, DigestType.DUMMY, b"").metadata.ledger_id
               for _ in range(12)]
    assert created == sorted(set(created))
    store.register_bookie("b1:3181")  # /ledgers/available is no ledger
    store.create("/ledgers/Lnot-a-ledger", b"")
    assert ledgers.ledger_ids() == created
    assert store.exists(FLAT.ledger_path(created[0]))
    assert FLAT.ledger_path(7) == "/ledgers/L0000000007"


def test_create_skips_an_id_whose_path_is_taken(ledgers, store):
    first = ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"").metadata.ledger_id
    store.create(FLAT.ledger_path(first + 1), b"written by hand")
    second = ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"").metadata.ledger_id
    assert second == first + 2


def test_invalid_create_uses_up_no_id(ledgers):
    first = ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"").metadata.ledger_id
    with pytest.raises(InvalidLedgerMetadata):
        ledgers.create_ledger(B, 2, 3, DigestType.CRC32C, b"")
    with pytest.raises(InvalidLedgerMetadata):
        ledgers.create_ledger(["B1", "B1"], 2, 2, DigestType.CRC32C, b"")
    assert ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"").metadata.ledger_id == first + 1


def test_a_damaged_record_is_reported_with_its_path(ledgers, store):
    store.create(FLAT.ledger_path(3), b"garbage")
    with pytest.raises(MalformedMetadata, match="L0000000003"):
        ledgers.read(3)
    store.create(FLAT.ledger_path(4), metadata(ledger_id=5).to_bytes())
    with pytest.raises(MalformedMetadata, match="metadata of ledger 5"):
        ledgers.read(4)


def test_watch_one_ledger(ledgers):
    md, version = ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"")
    other, _ = ledgers.create_ledger(B, 3, 2, DigestType.CRC32C, b"")
    calls: queue.Queue[int] = queue.Queue()
    with ledgers.watch(md.ledger_id, calls.put):
        ledgers.update(other, 0)
        ledgers.update(dataclasses.replace(md, state=LedgerState.IN_RECOVERY), version)
        assert calls.get(timeout=10) == md.ledger_id
        ledgers.delete(md.ledger_id)
        assert calls.get(timeout=10) == md.ledger_id
    assert calls.empty()


def test_ledger_metadata_survives_a_restart(tmp_path):
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        created = LedgerManager(store).create_ledger(B, 3, 2, DigestType.MAC, b"pw")
    with EmbeddedMetadataStore(tmp_path / "meta") as store:
        assert LedgerManager(store).read(created.metadata.ledger_id) == created


def test_header_layout():
    magic, version, length, checksum = struct.unpack(">4sHII", GOLDEN[:14])
    assert (magic, version, length) == (b"PBKL", 2, len(GOLDEN) - 14)
    assert checksum == crc32c(GOLDEN[14:])
