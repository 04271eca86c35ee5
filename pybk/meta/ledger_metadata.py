"""Ledger metadata: what the metadata store knows of one ledger, and its serialization.

:class:`LedgerMetadata` is immutable and valid by construction (E >= Qw >= Qa >= 1;
fragments non-empty, the first at entry 0, first entry ids increasing, each ensemble E
distinct bookies; a last entry id and a length exactly when CLOSED).  Change it with
:func:`dataclasses.replace`, which validates again.

The password is never stored.  ``password_hash`` is 48 bytes: a random 16-byte salt, then
SHA-256 of ``b"pybk ledger password\\x00" + salt + password``.  The prefix keeps the hash
apart from any other digest of the password (a bookie's master key is derived from the
password too, and a metadata reader must not learn it); the salt keeps equal passwords
from having equal hashes.  :meth:`LedgerMetadata.check_password` compares in constant time.

The MAC digest's key is SHA-1(``mac_key_prefix`` + password): ``"mac"``, BookKeeper's,
for every ledger created since format version 2, so that the key a bookie is given with
every add (the master key, SHA-1(``"ledger"`` + password)) cannot forge a MAC.  Ledgers
created in format version 1 keep ``"ledger"`` (their entries were digested with the
master key) and stay readable; their entries can be forged by whoever has the master key.

Serialized format: a sealed record (:mod:`pybk.meta.sealed`: header, CRC-32C, JSON body)
with magic b"PBKL" and format version 2 (:meth:`LedgerMetadata.to_bytes`).  The body has
exactly these keys::

    "ledger_id"          int, 0 .. 2**63 - 1
    "ensemble_size"      int (E)
    "write_quorum_size"  int (Qw)
    "ack_quorum_size"    int (Qa)
    "state"              "OPEN" | "IN_RECOVERY" | "CLOSED"
    "last_entry_id"      int (-1: closed empty) if CLOSED, else null
    "length"             int (bytes of entry data) if CLOSED, else null
    "digest_type"        "CRC32" | "CRC32C" | "MAC" | "DUMMY"
    "password_hash"      base64 of the 48 bytes above
    "creation_time_ms"   int, milliseconds since the Unix epoch
    "custom_metadata"    {name: base64 of the value bytes}
    "fragments"          [[first entry id, [bookie id, ...]], ...], in entry order
    "mac_key_prefix"     "mac" | "ledger" (see above)

Format version 1 (pybk before the MAC key was BookKeeper's) has every key but
``mac_key_prefix``, and is read as ``"ledger"``.  This version writes version 2 only: a
ledger of version 1 is rewritten in version 2, with its prefix, at its next change.

:meth:`LedgerMetadata.from_bytes` raises :class:`~pybk.errors.MalformedMetadata` for
anything else: what :func:`~pybk.meta.sealed.unseal` refuses, a value of the wrong type,
or metadata that breaks a rule above.
"""

from __future__ import annotations

import bisect
import enum
import functools
import hashlib
import hmac
import os
import time
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from pybk.errors import InvalidLedgerMetadata, MalformedMetadata
from pybk.meta.sealed import b64, seal, typed, unb64, unseal_versions

MAGIC = b"PBKL"
FORMAT_VERSION = 2
#: The MAC key prefixes: BookKeeper's, and format 1's (the master key's).
MAC_KEY_PREFIXES = ("mac", "ledger")
INT64_MAX = (1 << 63) - 1
SALT_BYTES = 16
PASSWORD_HASH_BYTES = SALT_BYTES + hashlib.sha256().digest_size
_PASSWORD_PREFIX = b"pybk ledger password\0"


class LedgerState(enum.Enum):
    """OPEN: its writer adds entries; IN_RECOVERY: a reader fences it to close it;
    CLOSED: its last entry id and length are final."""

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class DigestType(enum.Enum):
    """How entries are digested by the client (BookKeeper's ``DigestType``)."""

    CRC32 = "CRC32"
    CRC32C = "CRC32C"
    MAC = "MAC"
    DUMMY = "DUMMY"


class Fragment(NamedTuple):
    """Entries from ``first_entry_id`` on (up to the next fragment) live on ``ensemble``."""

    first_entry_id: int
    ensemble: tuple[str, ...]


def hash_password(password: bytes, salt: bytes | None = None) -> bytes:
    """A salted hash of ``password`` for :attr:`LedgerMetadata.password_hash`, with a fresh
    random salt unless ``salt`` (SALT_BYTES) is given (a reproducible record: tests)."""
    if salt is None:
        salt = os.urandom(SALT_BYTES)
    elif len(salt) != SALT_BYTES:
        raise ValueError(f"a salt is {SALT_BYTES} bytes, not {len(salt)}")
    return salt + _digest(salt, password)


def _digest(salt: bytes, password: bytes) -> bytes:
    return hashlib.sha256(_PASSWORD_PREFIX + salt + bytes(password)).digest()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_int(name: str, value: Any, low: int, high: int = INT64_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidLedgerMetadata(f"{name} must be an integer from {low} to {high}, "
                                    f"not {value!r}")
    return value


@dataclass(frozen=True)
class LedgerMetadata:
    """The metadata of one ledger (see the module docstring for the rules)."""

    ledger_id: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    fragments: tuple[Fragment, ...]
    digest_type: DigestType
    password_hash: bytes = field(repr=False)
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int | None = None
    length: int | None = None
    creation_time_ms: int = field(default_factory=_now_ms)
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict, hash=False)
    mac_key_prefix: str = "mac"

    def __post_init__(self) -> None:
        _check_int("ledger_id", self.ledger_id, 0)
        if self.mac_key_prefix not in MAC_KEY_PREFIXES:
            raise InvalidLedgerMetadata(f"mac_key_prefix must be one of {MAC_KEY_PREFIXES}, "
                                        f"not {self.mac_key_prefix!r}")
        e = _check_int("ensemble_size", self.ensemble_size, 1)
        qw = _check_int("write_quorum_size", self.write_quorum_size, 1)
        qa = _check_int("ack_quorum_size", self.ack_quorum_size, 1)
        if not e >= qw >= qa:
            raise InvalidLedgerMetadata(
                f"ensemble size {e}, write quorum {qw}, ack quorum {qa}: a ledger needs "
                "ensemble size >= write quorum >= ack quorum >= 1")
        if not isinstance(self.state, LedgerState):
            raise InvalidLedgerMetadata(f"state must be a LedgerState, not {self.state!r}")
        if self.state is LedgerState.CLOSED:
            last = _check_int("last_entry_id of a closed ledger", self.last_entry_id, -1)
            length = _check_int("length of a closed ledger", self.length, 0)
            if last == -1 and length:
                raise InvalidLedgerMetadata(f"a closed ledger without entries has length "
                                            f"0, not {length}")
        elif self.last_entry_id is not None or self.length is not None:
            raise InvalidLedgerMetadata(f"a {self.state.name} ledger has no last entry id or "
                                        "length yet (they are set when it is closed)")
        if not isinstance(self.digest_type, DigestType):
            raise InvalidLedgerMetadata(f"digest_type must be a DigestType, not "
                                        f"{self.digest_type!r}")
        if not isinstance(self.password_hash, bytes) \
                or len(self.password_hash) != PASSWORD_HASH_BYTES:
            raise InvalidLedgerMetadata(f"password_hash must be {PASSWORD_HASH_BYTES} bytes "
                                        "from hash_password(), never the password itself")
        _check_int("creation_time_ms", self.creation_time_ms, 0)
        object.__setattr__(self, "custom_metadata", _frozen_custom(self.custom_metadata))
        object.__setattr__(self, "fragments", _checked_fragments(self.fragments, e))

    # -- reading it -----------------------------------------------------------------

    def closed_last_entry_id(self) -> int:
        """The last entry id of a CLOSED ledger (-1: it has none).  Only for a closed
        ledger: an open one has no last entry id yet."""
        assert self.last_entry_id is not None, f"ledger {self.ledger_id} is not closed"
        return self.last_entry_id

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble of the fragment that holds ``entry_id``."""
        if not isinstance(entry_id, int) or entry_id < 0:
            raise ValueError(f"entry id {entry_id!r} is not an entry id (0, 1, 2, ...)")
        index = bisect.bisect_right([f.first_entry_id for f in self.fragments], entry_id)
        return self.fragments[index - 1].ensemble

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """The Qw bookies that store ``entry_id``: its ensemble from index
        ``entry_id % E`` on, wrapping around."""
        if isinstance(entry_id, int) and entry_id >= self.fragments[-1].first_entry_id:
            return self._last_write_sets[entry_id % self.ensemble_size]  # a writer's case
        return self._write_sets(self.ensemble_at(entry_id))[entry_id % self.ensemble_size]

    @functools.cached_property
    def _last_write_sets(self) -> tuple[tuple[str, ...], ...]:
        return self._write_sets(self.fragments[-1].ensemble)

    def _write_sets(self, ensemble: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        """The write set of each start index of ``ensemble``."""
        e = self.ensemble_size
        return tuple(tuple(ensemble[(start + i) % e] for i in range(self.write_quorum_size))
                     for start in range(e))

    def check_password(self, password: bytes) -> bool:
        """Whether ``password`` is the one the ledger was created with."""
        salt, digest = self.password_hash[:SALT_BYTES], self.password_hash[SALT_BYTES:]
        return hmac.compare_digest(_digest(salt, password), digest)

    # -- serialization ----------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The serialized form (format version 2, see the module docstring)."""
        return seal(MAGIC, FORMAT_VERSION, {
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum_size": self.write_quorum_size,
            "ack_quorum_size": self.ack_quorum_size,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type.value,
            "password_hash": b64(self.password_hash),
            "creation_time_ms": self.creation_time_ms,
            "custom_metadata": {k: b64(v) for k, v in self.custom_metadata.items()},
            "fragments": [[f.first_entry_id, list(f.ensemble)] for f in self.fragments],
            "mac_key_prefix": self.mac_key_prefix,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> "LedgerMetadata":
        """Decode :meth:`to_bytes` output; raises MalformedMetadata for anything else."""
        version, obj = unseal_versions(data, MAGIC, _KEYS, "ledger metadata")
        try:
            return cls(
                ledger_id=typed("ledger_id", obj["ledger_id"], int),
                ensemble_size=typed("ensemble_size", obj["ensemble_size"], int),
                write_quorum_size=typed("write_quorum_size", obj["write_quorum_size"], int),
                ack_quorum_size=typed("ack_quorum_size", obj["ack_quorum_size"], int),
                state=LedgerState(typed("state", obj["state"], str)),
                last_entry_id=typed("last_entry_id", obj["last_entry_id"], int, True),
                length=typed("length", obj["length"], int, True),
                digest_type=DigestType(typed("digest_type", obj["digest_type"], str)),
                password_hash=unb64(typed("password_hash", obj["password_hash"], str)),
                creation_time_ms=typed("creation_time_ms", obj["creation_time_ms"], int),
                custom_metadata={
                    k: unb64(typed(f"custom_metadata[{k!r}]", v, str))
                    for k, v in typed("custom_metadata", obj["custom_metadata"], dict).items()},
                fragments=tuple(_fragment(f)
                                for f in typed("fragments", obj["fragments"], list)),
                mac_key_prefix="ledger" if version == 1 else typed(
                    "mac_key_prefix", obj["mac_key_prefix"], str),
            )
        except ValueError as e:  # base64, enums, rules, types
            raise MalformedMetadata(f"ledger metadata body is malformed: {e}") from e


#: The keys of each format version's body.
_KEYS = {2: frozenset(f.name for f in LedgerMetadata.__dataclass_fields__.values())}
_KEYS[1] = _KEYS[2] - {"mac_key_prefix"}


def _frozen_custom(custom: Mapping[str, bytes]) -> Mapping[str, bytes]:
    if not isinstance(custom, Mapping):
        raise InvalidLedgerMetadata(f"custom_metadata must be a mapping, not {custom!r}")
    for key, value in custom.items():
        if not isinstance(key, str) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidLedgerMetadata(f"custom_metadata maps str to bytes; {key!r}: "
                                        f"{type(value).__name__} does not fit")
    return types.MappingProxyType({key: bytes(custom[key]) for key in sorted(custom)})


def _checked_fragments(fragments: Iterable[Any], ensemble_size: int) -> tuple[Fragment, ...]:
    checked: list[Fragment] = []
    for item in fragments:
        try:
            first, ensemble = item
            if isinstance(ensemble, str):
                raise TypeError("an ensemble is a sequence of bookie ids, not one string")
            ensemble = tuple(ensemble)
        except (TypeError, ValueError):
            raise InvalidLedgerMetadata(f"a fragment is (first entry id, sequence of bookie "
                                        f"ids), not {item!r}") from None
        fragment = Fragment(_check_int("a fragment's first entry id", first, 0), ensemble)
        if checked and fragment.first_entry_id <= checked[-1].first_entry_id:
            raise InvalidLedgerMetadata(f"fragments must start at increasing entry ids; "
                                        f"{fragment.first_entry_id} follows "
                                        f"{checked[-1].first_entry_id}")
        if len(fragment.ensemble) != ensemble_size or len(set(fragment.ensemble)) != \
                ensemble_size or not all(isinstance(b, str) and b for b in fragment.ensemble):
            raise InvalidLedgerMetadata(f"the ensemble {fragment.ensemble!r} from entry "
                                        f"{fragment.first_entry_id} is not {ensemble_size} "
                                        "distinct, non-empty bookie ids")
        checked.append(fragment)
    if not checked or checked[0].first_entry_id != 0:
        raise InvalidLedgerMetadata("a ledger's fragments must begin with one at entry 0, "
                                    f"not {[f.first_entry_id for f in checked]}")
    return tuple(checked)


def _fragment(item: Any) -> Fragment:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError(f"a fragment is [first entry id, [bookie id, ...]], not {item!r}")
    return Fragment(typed("a fragment's first entry id", item[0], int),
                    tuple(typed("a bookie id", b, str)
                          for b in typed("an ensemble", item[1], list)))
