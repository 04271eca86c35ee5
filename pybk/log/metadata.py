"""A log's metadata: its segments (ledgers, in order), kept under compare-and-set in
records whose size does not depend on how many segments the log has.

Format version 4.  Log ``name`` has a head record and one record per segment number, all
sealed records (:mod:`pybk.meta.sealed`)::

    /logs/<name>                                   the head (magic b"PBKG", version 4)
    /logs/<name>/segments/<number, 20 digits>      segment records (magic b"PBKS", version 2)
    /logs/<name>/consumers/<consumer id>           consumers' positions (:mod:`pybk.log.consumers`)
    /logs/<name>/jobs/<job id>[/<ledger id>]       jobs that write ledgers to commit to the
                                                   log (:mod:`pybk.log.jobs`)

The head's body::

    "name"              the log's name
    "next_segment"      the number the next segment gets (numbers are never reused)
    "truncated_before"  [segment, entry, slot]: records before it are gone
    "tail"              [[segment number, ledger id, max_before], ...]: the newest segments
                        (max_before: "Maxima before" below; null: unknown), numbers
                        increasing, at most TAIL_SEGMENTS (4) of them, except for a moment
                        after a commit (below): then up to TAIL_SEGMENTS + COMMIT_LEDGERS_MAX
    "oldest_segment"    every segment record numbered below it is deleted (truncation's
                        progress: below truncated_before's segment while one is unfinished)
    "dropping"          [[segment number, ledger id], ...]: empty segments the last writer
                        to open dropped from the log, whose ledgers it deletes (at most 2;
                        a null number is a ledger that a format-1 record was deleting)
    "epoch"             how many times the log was taken over: every opening writer's CAS
                        and every commit's adds one (see "Job bookkeeping" below)
    "sinks"             {sink id: batch id}: the last batch each streaming sink committed
                        (at most SINKS_MAX sinks, ids of at most SINK_ID_MAX_CHARS)
    "committing"        [job id, ...]: jobs whose commit CAS added their ledgers, whose
                        other ledgers and records may still have to be deleted
    "aborted"           [job id, ...]: jobs given up (orphans, or aborted by their
                        driver), whose ledgers and records may still have to be deleted

A segment record's body::

    "segment"    its number (the one in its name)
    "ledger_id"  the segment's ledger; null if no segment has this number (a *dead*
                 number: an empty segment that was dropped, or a number never used)
    "skip_to"    null for a segment; for a dead number, a greater number such that no
                 segment is numbered from this one up to it: a reader goes on there
    "hollow"     false for a segment; for a dead number, true if no number after it, up
                 to skip_to, has a record either (a deleting walk skips them)
    "max_before" for a segment, its max_before ("Maxima before"), the value the head
                 CAS that added the segment gave it; null for a dead number, and for a
                 segment whose max_before is unknown

The head stays a few hundred bytes however many segments the log has; segment records
are about 90 bytes and are never listed (a ZooKeeper node with a million children cannot
be listed in one packet): they are found by number.

**Finding a segment** (:func:`find_segment`), the first one numbered ``k`` or more:
below truncated_before's segment, start there; from the tail's first number on, the tail
has it; below that, read the record of ``k``: a ledger is the answer; a dead number goes
on at its ``skip_to``.  A missing record is a number inside a hollow run (``k`` given by a
caller), a number below a truncation newer than the head the search was given, or a dead
number whose record is being written: the search reads the stored head, and unless it
reached the number walking from truncated_before's segment (or the number is below the
stored truncated_before), it walks the records from the stored truncated_before's segment
to ``k``; only a number that walk reaches and finds without a record goes on at ``k + 1``.
So no search steps through the numbers of a hollow run: its cost is bounded by the
records between truncated_before's segment and ``k``.  A reader entering the next segment
below the tail reads the head and one record, whatever the number of segments: the first
number of every run of dead numbers between two segments has a dead record pointing past
the run, and truncated_before's segment is a segment or such a first number.

**Writers** compare-and-set the head only: fencing at open, rolling, truncation and
dropping are one CAS protocol on one record, as in format 1, on any metadata store.
Segment records follow these rules:

* The record of segment ``n`` is written by the writer whose head CAS added ``n``, right
  after that CAS and before its next one; a writer that opens the log first writes the
  records of every tail segment (one is missing only if a writer died between its CAS
  and its record write).  A CAS pushes at most one segment out of the tail, so *every
  segment not in the tail has its record*, whenever a writer dies.
* A segment record names the ledger fixed by the CAS that added the segment, so it is
  only ever created, never replaced: a writer that finds one present checks that it
  names the same ledger.
* A dead record replaces whatever record the number had.  A dead number stays dead
  (numbers are never reused), and a writer that was fenced meanwhile and writes a
  dropped segment's record late finds the dead record there and leaves it ("dead
  wins"): a late write cannot bring a dropped segment back.
* Records are deleted only below truncated_before's segment, where readers never look.

**Opening** (:mod:`pybk.log.writer`): read the head; finish what a writer that died left
undone (dead records and ledgers of ``dropping``, an unfinished truncation, missing tail
records, the leftovers of the jobs the head lists); fence and recover the last two
segments; of those, an empty one is dropped, but never the tail's first, so each dropped
segment has a segment before it in the tail, whose next number starts the run of dead
numbers (a log that restarts without writing keeps one run, with one record at its start
for readers, however often it restarts); then CAS the head with the new segment
appended, ``dropping`` set to the segments dropped, ``oldest_segment`` to
truncated_before's segment, ``epoch`` + 1 and no job listed.  After the CAS: the new
segment's record and the dead records of the runs between tail segments and of the
dropped segments, then the dropped segments' ledgers are deleted.  ``dropping`` is
cleared by that writer's next CAS, or by the next opener, which does the same steps
again (each of them can be repeated) before its own CAS.

**Rolling**: CAS the head with the new segment appended (the oldest tail segment, whose
record exists, leaves the tail if it is full), then write the new segment's record.

**Truncation** before position ``p`` (moved to the start of the first segment at or
after it if ``p.segment`` is a dead number): CAS the head (truncated_before = p, tail
without the segments below ``p.segment``); then a walk (:func:`delete_records`) from the
stored head's ``oldest_segment`` up to ``p.segment``, in number order: a missing record
goes on at the next number, or at the stored head's ``oldest_segment`` if that is
further (another walk, an opener's or a committer's going on at the same time, may have
passed a hollow run from there); a segment record has its ledger deleted, then the
record; a non-hollow dead record is deleted; a hollow record (number ``h``, run up to
``s``) is deleted in one atomic step with a CAS of the head that moves
``oldest_segment`` up to ``s`` (:func:`pass_hollow`: a CAS of that field alone, made
again on a head that changed meanwhile, never moving it back), and the walk goes on at
``s``.  Last, CAS ``oldest_segment = p.segment``.  A walk that stops anywhere (a crash,
MetadataUnavailable) leaves ``oldest_segment`` behind truncated_before; the next opener,
commit, or the writer truncating again, walks again from the stored ``oldest_segment``
(never from a head read before the stop).  Crash guarantee: after every step, every
record below the stored ``oldest_segment`` is deleted, and every hollow run from it up
to truncated_before's segment still has its record, so no walk ever steps through a
hollow run's numbers (a fenced writer's record written late may land below it: nothing
reads there, and :func:`delete_log` lists and deletes such records).  A walk costs a read
per segment number ever used and per dead record in its range (each number was given to
a segment once; a resumed walk reads again those the stopped one deleted after its last
CAS, with a read of the head for each), and one read and one write per hollow run,
whatever the log's length and however many numbers the runs skip.  A CAS that changes
only ``oldest_segment`` takes the log over from no one (:meth:`LogMetadata.same_owner`):
a writer whose head CAS meets one makes its change again on it; an opener or committer
whose own walk made one loses its CAS once and starts again from the new head.

**Demotion** (:mod:`pybk.log.promotion`) makes the next segment number jump by 2^32: a
hollow dead record at the first number skipped covers the jump (written before the head
CAS that makes the jump, so every head that says so has it).

**Commits** (:mod:`pybk.log.commit`) append the closed ledgers of a job (a Spark job's
tasks each wrote ledgers of their own) to the log as new segments, in one CAS, so that
readers see all of a job or none of it.  A commit acts as an opening writer (so a live
writer of the log gets LogFenced at its next add or head change, as when another writer
opens): it finishes what a dead writer or committer left, fences and recovers the last
two segments, then CASes the head with the job's ledgers appended as segments
``next_segment``, ``next_segment + 1``, ... (no empty segment for a writer), the job in
``committing``, ``epoch`` + 1 and, for a streaming sink, ``sinks[sink id]`` = its batch id.
That CAS may leave a tail longer than TAIL_SEGMENTS (at most COMMIT_LEDGERS_MAX ledgers
a commit; more are refused): the committer writes the new segments' records right after
it, then CASes the head again with the tail cut back to TAIL_SEGMENTS (and ``committing``
cleared, once the job's records are deleted).  A committer that dies in between leaves
the long tail to the next opener or committer, which writes every tail segment's record
first (:func:`ensure_records`) and cuts the tail in its own CAS, as it converts format 1.
With ``overwrite`` the same first CAS sets truncated_before to the start of the job's
first segment and keeps only the job's segments in the tail: the older ones are deleted
by the truncation walk, as for a writer's truncation.  A commit whose sink already
recorded its batch id changes nothing (a replayed micro-batch is committed once); one
whose sink recorded a later batch id is refused (InvalidConfiguration: a reset
checkpoint, to start over under a new sink id), never skipped silently.

**Job bookkeeping** rides on the head's CAS, so a commit, an abort and an orphan cleaner
never disagree about a job: a job's fate is decided by the CAS that lists it, in
``committing`` (its ledgers in the log) or in ``aborted`` (its ledgers to delete), and a
committer fails without changing anything when its job is listed as aborted or its
records are gone (deleted after such a CAS).  Whoever reads a head that lists jobs
deletes their leftover ledgers and records before its own CAS, which then drops them
from the lists, so the lists never hold more than one CAS adds (a committer's job, at
most ORPHANS_PER_CAS_MAX orphans).  These CASes change no field but ``committing`` and
``aborted`` unless they take the log over (and bump ``epoch``): a writer whose head CAS
fails (a roll, a truncation) re-reads the head and, if it differs from the one the
writer wrote in the job lists only, makes its change again on it (no takeover happened:
:meth:`LogMetadata.same_owner`); any other change, a new epoch above all, means another
writer or a commit took the log over: LogFenced.  (A committed job's record names the
ledgers its commit appends, written before the CAS, so whoever settles it knows which
of its ledgers to keep: :mod:`pybk.log.jobs`.)

**Maxima before** (for searches by time, :mod:`pybk.log.timeindex`).  A segment's
``max_before`` is an int: at least the largest timestamp of the records of every segment
numbered below it, from the first segment of the log that has a max_before on
(NO_TIMESTAMP, -1: no such record has a timestamp); null (None) if unknown.  It is fixed
by the head CAS that adds the segment, so its record, written after that CAS (by that
writer, or by whoever finds it missing, from the head: :func:`ensure_records`), says the
same, and "created once, never replaced" holds for it as for the ledger id.  Each one is
made from the segment before it (:func:`next_max_before`: that segment's max_before and
an upper bound of that segment's largest timestamp): a writer that rolls takes the
largest timestamp it sent to its segment (no batch goes to a segment once its roll
started); an opener or a committer (both take the log over first) takes the largest
timestamp of the last tail segment that survives the takeover (closed by then: the
header max of its last entry if its ledger keeps running maxima,
:func:`~pybk.log.batch.keeps_running_maxima`; else the largest header max of its
entries), and a commit
chains its ledgers the same way, reading each one's before its CAS (with ``overwrite``
its first segment's is NO_TIMESTAMP: nothing before it stays).  So max_before never
decreases with the segment number among live segments, whatever a dropped segment
(empty), a lost CAS (its number is never a segment) or truncation does (a truncation
leaves the values, which stay upper bounds).  A writer fenced meanwhile cannot break
this: its late record carries the value of its own CAS, the one that gave the number.
Unknown values are the oldest segments only: a segment added by a pybk before format 4
has none, and a takeover whose last tail segment has none gives its new segment
NO_TIMESTAMP (the index starts there, covering the segments from it on), so every
segment after a known one has a known one too (so a ledger whose largest timestamp is
not in its last header is read, not left unknown: :mod:`pybk.log.timeindex`, "Untagged
ledgers").  A pybk before format 4 refuses the head and the records (their format
versions), so it cannot add a segment without one.  A known max_before on a log
writer's segment also says that its ledger keeps running maxima, tagged or not (the
LogWriter that came with format 4 keeps them, and it alone adds such segments): other
code that adds segments of ledgers named after the log and not after a job must keep
them too (:func:`~pybk.log.batch.keeps_running_maxima`).  A head
whose tail breaks either rule is refused where it is made (:class:`LogMetadata`), so no
CAS writes one and no read accepts one.

**Format 3** (tail segments without max_before) and segment records of **format 1**
(without ``max_before``) are read with max_before None; the next takeover's CAS writes
format 4.

**Format 2** (no ``epoch``, ``sinks``, ``committing``, ``aborted``) is read as a head
whose new fields are empty; the next CAS writes format 4.

**Format 1** (one record holding the whole list: ``segments`` instead of ``tail`` and
``oldest_segment``, and ``deleting``, a list of ledger ids, instead of ``dropping``) is
read as a head whose tail is every segment (:attr:`LogMetadata.format_version` 1), so a
log written by an earlier pybk reads as before.  The first writer that opens it converts
it with the steps of any opening: it writes every segment's record and a hollow dead
record at the start of every gap (format 1 wrote none), in number order and in atomic
batches (:meth:`~pybk.meta.interface.MetadataStore.create_many`: one commit per
thousands of records), and its CAS writes format 4 with the newest TAIL_SEGMENTS.  A
crash in the middle leaves the format-1 record and a prefix of the batches, and the
next opener writes the records still missing.  Format 1 had to fit its list in one
record (MAX_DATA_BYTES, about 34,400 segments); such a log opens this way too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple

from pybk.errors import BadVersion, MalformedMetadata, MetadataError, NodeExists, NoNode
from pybk.log.position import START, Position
from pybk.meta import paths
from pybk.meta.interface import ANY_VERSION, MetadataStore, batches
from pybk.meta.sealed import HEADER, seal, typed, unseal, unseal_versions

MAGIC = b"PBKG"
FORMAT_VERSION = 4
SEGMENT_MAGIC = b"PBKS"
SEGMENT_FORMAT_VERSION = 2
#: A segment's max_before when no record before it (in the index: see "Maxima before")
#: has a timestamp: timestamps are 0 or more (:func:`pybk.log.batch.check_timestamp`).
NO_TIMESTAMP = -1
#: The parent of every log's records (in ZooKeeper under the cluster's root:
#: ``<root>/pybk/logs``, :mod:`pybk.meta.zookeeper`).
LOGS = "/logs"
SEGMENTS = "segments"
CONSUMERS = "consumers"
JOBS = "jobs"
#: How many of the newest segments the head lists.  At least two: an opening writer
#: recovers the last two segments from the head.
TAIL_SEGMENTS = 4
#: How many ledgers one commit may append.  The head lists them all for a moment (about
#: 40 bytes each at most), so it stays under 200 KB, far below MAX_DATA_BYTES.
COMMIT_LEDGERS_MAX = 4096
#: How many streaming sinks a log records, and how long a sink id may be.
SINKS_MAX = 256
SINK_ID_MAX_CHARS = 128
#: How many orphan jobs one CAS gives up (the rest wait for the next one).
ORPHANS_PER_CAS_MAX = 32
#: How many times :func:`pass_hollow` (and :func:`delete_log`'s first CAS) is made again
#: on a head that changed.
PROGRESS_ATTEMPTS_MAX = 10
_NUMBER_DIGITS = 20


class Segment(NamedTuple):
    """One ledger of a log, with its segment number and its max_before (None: unknown,
    written by an older pybk; see "Maxima before" in the module docstring)."""

    number: int
    ledger_id: int
    max_before: int | None = None


def next_max_before(segment: Segment | None, segment_max: int | None) -> int:
    """The max_before of the segment that comes after ``segment`` (None: after no live
    segment), whose records' largest timestamp is at most ``segment_max`` (None: it has
    no record with a timestamp).  A ``segment`` whose max_before is unknown starts the
    index: the next one's is NO_TIMESTAMP ("Maxima before" in the module docstring)."""
    if segment is None or segment.max_before is None:
        return NO_TIMESTAMP
    return segment.max_before if segment_max is None else max(segment.max_before, segment_max)


class Dropped(NamedTuple):
    """A segment whose ledger is being deleted after it was dropped from the log
    (``number`` None: a ledger a format-1 record was deleting, which has no record)."""

    number: int | None
    ledger_id: int


@dataclasses.dataclass(frozen=True)
class LogMetadata:
    """A log's head record (immutable; replace to change).  See the module docstring."""

    name: str
    tail: tuple[Segment, ...] = ()
    next_segment: int = 0
    truncated_before: Position = START
    oldest_segment: int = 0
    dropping: tuple[Dropped, ...] = ()
    epoch: int = 0
    sinks: Mapping[str, int] = dataclasses.field(default_factory=dict)
    committing: tuple[str, ...] = ()
    aborted: tuple[str, ...] = ()
    #: The format the record was read in; 1: the tail is every segment of the log and
    #: no segment has a record yet.  Written in the newest format only.
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        numbers = [s.number for s in self.tail]
        if numbers != sorted(set(numbers)) or any(n >= self.next_segment for n in numbers):
            raise ValueError(f"log {self.name}: segment numbers {numbers} must increase and "
                             f"stay under next_segment={self.next_segment}")
        befores = [s.max_before for s in self.tail]
        known = [b for b in befores if b is not None]
        if known != sorted(known) or befores[len(befores) - len(known):] != known:
            raise ValueError(f"log {self.name}: the tail's max_before values {befores} must "
                             "never decrease, unknown ones (None) first")
        if numbers and numbers[0] < self.truncated_before.segment:
            raise ValueError(f"log {self.name}: segment {numbers[0]} is before "
                             f"truncated_before={self.truncated_before}")
        if self.oldest_segment > self.truncated_before.segment:
            raise ValueError(f"log {self.name}: oldest_segment={self.oldest_segment} is past "
                             f"truncated_before={self.truncated_before}")
        if len(self.sinks) > SINKS_MAX or any(
                len(k) > SINK_ID_MAX_CHARS or v < 0 for k, v in self.sinks.items()):
            raise ValueError(f"log {self.name}: sinks {dict(self.sinks)} must be at most "
                             f"{SINKS_MAX} ids of at most {SINK_ID_MAX_CHARS} characters, "
                             "each with a batch id of 0 or more")
        listed = self.committing + self.aborted
        if len(set(listed)) != len(listed):
            raise ValueError(f"log {self.name}: a job is listed twice in committing "
                             f"{self.committing} and aborted {self.aborted}")

    def same_owner(self, other: "LogMetadata") -> bool:
        """Whether ``other`` differs from this head in job bookkeeping (``committing`` and
        ``aborted``) and truncation's progress (``oldest_segment``) only: no writer or
        commit took the log over in between."""
        return dataclasses.replace(other, committing=self.committing, aborted=self.aborted,
                                   oldest_segment=self.oldest_segment) == self

    def with_new_segment(self, ledger_id: int, max_before: int) -> "LogMetadata":
        """The log with one more segment at its end, whose max_before is ``max_before``,
        in the newest format: the oldest tail segment leaves the tail if it is full (its
        record exists, by the invariant of the module docstring; a format-1 head's
        records are written first: :func:`ensure_records`)."""
        tail = self.tail + (Segment(self.next_segment, ledger_id, max_before),)
        return dataclasses.replace(self, tail=tail[-TAIL_SEGMENTS:],
                                   next_segment=self.next_segment + 1,
                                   format_version=FORMAT_VERSION)

    def to_bytes(self) -> bytes:
        if self.format_version != FORMAT_VERSION \
                or len(self.tail) > TAIL_SEGMENTS + COMMIT_LEDGERS_MAX:
            raise ValueError(f"log {self.name}: a head of format {self.format_version} with "
                             f"{len(self.tail)} tail segments is not a format-"
                             f"{FORMAT_VERSION} head (at most {TAIL_SEGMENTS}, or "
                             f"{TAIL_SEGMENTS + COMMIT_LEDGERS_MAX} after a commit): write "
                             "the records of the others first (ensure_records)")
        return seal(MAGIC, FORMAT_VERSION, {
            "name": self.name,
            "next_segment": self.next_segment,
            "truncated_before": list(self.truncated_before),
            "tail": [list(s) for s in self.tail],  # [number, ledger id, max_before]
            "oldest_segment": self.oldest_segment,
            "dropping": [list(d) for d in self.dropping],
            "epoch": self.epoch,
            "sinks": dict(self.sinks),
            "committing": list(self.committing),
            "aborted": list(self.aborted),
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> "LogMetadata":
        """A head in the newest format, or an older one read as one (module docstring)."""
        data = bytes(data)
        version = HEADER.unpack_from(data)[1] if len(data) >= HEADER.size else None
        if version == 1:
            return cls._from_format_1(unseal(data, MAGIC, 1, _KEYS_1, "log metadata"))
        if version in (2, 3):
            obj = unseal(data, MAGIC, version, _KEYS if version == 3 else _KEYS_2,
                         "log metadata")
            if version == 2:
                obj.update(epoch=0, sinks={}, committing=[], aborted=[])
        else:
            obj = unseal(data, MAGIC, FORMAT_VERSION, _KEYS, "log metadata")
            version = FORMAT_VERSION  # unseal() refused any other
        try:
            return cls(
                name=typed("name", obj["name"], str),
                tail=tuple(_tail_segment(s, version)
                           for s in typed("tail", obj["tail"], list)),
                next_segment=typed("next_segment", obj["next_segment"], int),
                truncated_before=Position(*_ints("truncated_before",
                                                 obj["truncated_before"], 3)),
                oldest_segment=typed("oldest_segment", obj["oldest_segment"], int),
                dropping=tuple(_dropped(d) for d in typed("dropping", obj["dropping"], list)),
                epoch=typed("epoch", obj["epoch"], int),
                sinks={typed("a sink id", k, str): typed("a batch id", v, int)
                       for k, v in typed("sinks", obj["sinks"], dict).items()},
                committing=_job_ids("committing", obj["committing"]),
                aborted=_job_ids("aborted", obj["aborted"]),
                format_version=version)
        except ValueError as e:
            raise MalformedMetadata(f"log metadata body is malformed: {e}") from e

    @classmethod
    def _from_format_1(cls, obj: dict) -> "LogMetadata":
        try:
            truncated_before = Position(*_ints("truncated_before", obj["truncated_before"], 3))
            return cls(
                name=typed("name", obj["name"], str),
                tail=tuple(Segment(*_ints("a segment", s, 2))
                           for s in typed("segments", obj["segments"], list)),
                next_segment=typed("next_segment", obj["next_segment"], int),
                truncated_before=truncated_before,
                oldest_segment=truncated_before.segment,  # format 1 wrote no records
                dropping=tuple(Dropped(None, typed("a ledger id", i, int))
                               for i in typed("deleting", obj["deleting"], list)),
                format_version=1)
        except ValueError as e:
            raise MalformedMetadata(f"log metadata (format 1) body is malformed: {e}") from e


_KEYS_2 = frozenset(("name", "next_segment", "truncated_before", "tail", "oldest_segment",
                     "dropping"))
_KEYS = _KEYS_2 | {"epoch", "sinks", "committing", "aborted"}
_KEYS_1 = frozenset(("name", "segments", "next_segment", "truncated_before", "deleting"))


def _ints(name: str, value: object, count: int) -> list[int]:
    if not isinstance(value, list) or len(value) != count:
        raise ValueError(f"{name} is {value!r}, not a list of {count} integers")
    return [typed(name, v, int) for v in value]


def _tail_segment(value: object, version: int) -> Segment:
    """A tail segment of a head of format ``version`` (before 4: [number, ledger id])."""
    if version < 4:
        return Segment(*_ints("a segment", value, 2))
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"a tail segment is {value!r}, not [number, ledger id, "
                         "max_before or null]")
    return Segment(typed("a segment's number", value[0], int),
                   typed("a segment's ledger id", value[1], int),
                   _max_before(value[2]))


def _max_before(value: object) -> int | None:
    max_before = typed("max_before", value, int, nullable=True)
    if max_before is not None and max_before < NO_TIMESTAMP:
        raise ValueError(f"max_before is {max_before}, below {NO_TIMESTAMP}")
    return max_before


def _job_ids(name: str, value: object) -> tuple[str, ...]:
    return tuple(typed(f"a job id in {name}", v, str) for v in typed(name, value, list))


def _dropped(value: object) -> Dropped:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"a dropped segment is {value!r}, not [number or null, ledger id]")
    return Dropped(typed("a dropped segment's number", value[0], int, nullable=True),
                   typed("a dropped segment's ledger id", value[1], int))


class SegmentRecord(NamedTuple):
    """What the record of one segment number says (see the module docstring)."""

    number: int
    ledger_id: int | None       # None: a dead number
    skip_to: int | None = None  # for a dead number: no segment below this one either
    hollow: bool = False        # for a dead number: no record below skip_to either
    max_before: int | None = None  # for a segment: "Maxima before" (None: unknown)

    def to_bytes(self) -> bytes:
        return seal(SEGMENT_MAGIC, SEGMENT_FORMAT_VERSION, {
            "segment": self.number, "ledger_id": self.ledger_id, "skip_to": self.skip_to,
            "hollow": self.hollow, "max_before": self.max_before})

    @classmethod
    def from_bytes(cls, data: bytes, number: int) -> "SegmentRecord":
        """The record found at segment ``number``'s path (format 1 read with max_before
        None); MalformedMetadata if it is not one, or not that number's."""
        version, obj = unseal_versions(data, SEGMENT_MAGIC, {
            1: _SEGMENT_KEYS_1, SEGMENT_FORMAT_VERSION: _SEGMENT_KEYS}, "segment record")
        old = version == 1
        try:
            record = cls(typed("segment", obj["segment"], int),
                         typed("ledger_id", obj["ledger_id"], int, nullable=True),
                         typed("skip_to", obj["skip_to"], int, nullable=True),
                         typed("hollow", obj["hollow"], bool),
                         None if old else _max_before(obj["max_before"]))
        except ValueError as e:
            raise MalformedMetadata(f"segment record body is malformed: {e}") from e
        dead = record.ledger_id is None
        if record.number != number or dead != (record.skip_to is not None) \
                or (record.skip_to is not None and record.skip_to <= number) \
                or (record.hollow and not dead) or (dead and record.max_before is not None):
            raise MalformedMetadata(f"the record of segment {number} says {record}: it must "
                                    "name its own number and either a ledger or a greater "
                                    "number to skip to")
        return record


_SEGMENT_KEYS_1 = frozenset(("segment", "ledger_id", "skip_to", "hollow"))
_SEGMENT_KEYS = _SEGMENT_KEYS_1 | {"max_before"}


class VersionedLog(NamedTuple):
    metadata: LogMetadata
    version: int


# -- paths ----------------------------------------------------------------------------


def log_path(name: str) -> str:
    """The head record of log ``name`` (a valid record name: no '/', not empty)."""
    return paths.join(LOGS, paths.check_name(name))


def segments_path(name: str) -> str:
    """The parent of log ``name``'s segment records."""
    return paths.join(log_path(name), SEGMENTS)


def jobs_path(name: str) -> str:
    """The parent of log ``name``'s job records (:mod:`pybk.log.jobs`)."""
    return paths.join(log_path(name), JOBS)


def segment_path(name: str, number: int) -> str:
    """The record of segment ``number`` of log ``name``."""
    return paths.join(segments_path(name), f"{number:0{_NUMBER_DIGITS}d}")


def consumers_path(name: str) -> str:
    """The parent of log ``name``'s consumer records (:mod:`pybk.log.consumers`)."""
    return paths.join(log_path(name), CONSUMERS)


def consumer_path(name: str, consumer_id: str) -> str:
    """The record of consumer ``consumer_id`` of log ``name``."""
    return paths.join(consumers_path(name), paths.check_name(consumer_id))


# -- the head -------------------------------------------------------------------------


def read_log(store: MetadataStore, name: str, create: bool = False) -> VersionedLog:
    """The log's head and its version; with ``create``, a new empty log if there is none
    (NoNode otherwise)."""
    path = log_path(name)
    if create and not store.exists(path):
        empty = LogMetadata(name)
        try:
            return VersionedLog(empty, store.create(path, empty.to_bytes()))
        except NodeExists:
            pass  # created meanwhile by another writer: read theirs
    data, version = store.get(path)
    return VersionedLog(LogMetadata.from_bytes(data), version)


def update_log(store: MetadataStore, metadata: LogMetadata, expected_version: int) -> int:
    """Compare-and-set the log's head; the new version (BadVersion if it moved on)."""
    return store.set(log_path(metadata.name), metadata.to_bytes(), expected_version)


def list_logs(store: MetadataStore) -> list[str]:
    """The names of every log in the store, sorted."""
    return store.children(LOGS) if store.exists(LOGS) else []


def delete_log(store: MetadataStore, name: str) -> None:
    """Delete the log's records (segments, consumers, jobs), head last (its ledgers are
    left alone, those of its jobs too); nothing if it has no head.  The head is first
    truncated before its next segment number, so that the segment records go as a
    truncation's do, and a crash leaves an empty log that the next call deletes."""
    for _ in range(PROGRESS_ATTEMPTS_MAX):
        try:
            metadata, version = read_log(store, name)
        except NoNode:
            return
        end = metadata.next_segment
        if metadata.truncated_before.segment == end and not metadata.tail \
                and metadata.format_version == FORMAT_VERSION:
            break
        try:
            update_log(store, dataclasses.replace(
                metadata, tail=(), truncated_before=Position(end, 0, 0),
                format_version=FORMAT_VERSION), version)
            break
        except BadVersion:
            pass  # a writer changed it: truncate that head
    else:
        raise MetadataError(f"log {name}: lost the race to truncate it before deleting it "
                            f"{PROGRESS_ATTEMPTS_MAX} times in a row")
    delete_records(store, name, end)
    # Listed once the walk deleted the rest: the records written late below a walk (a
    # fenced writer's record of a segment it added, written after another writer's
    # truncation passed its number), which no walk finds, if any.
    delete_tree(store, segments_path(name))
    delete_tree(store, jobs_path(name))
    delete_tree(store, consumers_path(name))
    try:
        store.delete(log_path(name), ANY_VERSION)
    except NoNode:
        pass


def delete_tree(store: MetadataStore, path: str) -> None:
    """Delete the record at ``path`` and every record below it (gone ones are skipped)."""
    try:
        children = store.children(path)
    except NoNode:
        return
    for child in children:
        delete_tree(store, paths.join(path, child))
    try:
        store.delete(path, ANY_VERSION)
    except NoNode:
        pass


# -- segment records ------------------------------------------------------------------


def read_segment(store: MetadataStore, name: str, number: int) -> SegmentRecord | None:
    """The record of segment ``number``, or None if it has none."""
    try:
        data, _version = store.get(segment_path(name, number))
    except NoNode:
        return None
    return SegmentRecord.from_bytes(data, number)


def write_segment(store: MetadataStore, name: str, segment: Segment) -> None:
    """Create the record of ``segment`` unless it exists (it is never replaced: a dead
    record stays dead; MalformedMetadata if it names another ledger)."""
    try:
        store.create(segment_path(name, segment.number),
                     SegmentRecord(segment.number, segment.ledger_id,
                                   max_before=segment.max_before).to_bytes())
        return
    except NodeExists:
        pass
    found = read_segment(store, name, segment.number)
    if found is not None and found.ledger_id not in (None, segment.ledger_id):
        raise MalformedMetadata(f"log {name}: the record of segment {segment.number} names "
                                f"ledger {found.ledger_id}, its head ledger "
                                f"{segment.ledger_id}")


def mark_dead(store: MetadataStore, name: str, number: int, skip_to: int,
              hollow: bool = False) -> None:
    """Record that no segment is numbered from ``number`` up to ``skip_to`` (and, if
    ``hollow``, that no number in between has a record), replacing whatever record the
    number had unless it says as much already."""
    found = read_segment(store, name, number)
    if found is not None and found.ledger_id is None:
        assert found.skip_to is not None  # from_bytes: a dead record names its skip_to
        if found.skip_to >= skip_to:
            return
        hollow = hollow and found.hollow  # the records its run may hold are still there
    data = SegmentRecord(number, None, skip_to, hollow).to_bytes()
    path = segment_path(name, number)
    try:
        store.create(path, data)
    except NodeExists:
        store.set(path, data, ANY_VERSION)


def store_records(store: MetadataStore, name: str, segments: Iterable[Segment],
                  start: int | None = None, end: int | None = None,
                  hollow: bool = False) -> None:
    """Write the record of every one of ``segments`` (numbers increasing) and a dead
    record at the first number of every gap between them; also of the gaps from
    ``start`` to the first and from the last to ``end`` (exclusive), which the caller
    knows hold no other segment.  ``hollow``: the caller knows the gaps hold no record.

    The records are created in batches (:meth:`MetadataStore.create_many`), in number
    order, each batch atomic: a format-1 conversion writes tens of thousands of them
    with one commit per batch, not per record.  A batch that meets a record already
    there (written by an opener that died, or by this writer's earlier CAS) is written
    record by record instead, by the rules of :func:`write_segment` and
    :func:`mark_dead`.  All of them are written when this returns, before the caller's
    next head CAS; a crash on the way leaves a prefix of batches, which the next opener
    finds and completes."""
    planned = {segment_path(name, r.number): r
               for r in _planned_records(segments, start, end, hollow)}
    for batch in batches((path, r.to_bytes()) for path, r in planned.items()):
        try:
            store.create_many(batch)
        except NodeExists:
            for path, _data in batch:
                record = planned[path]
                if record.ledger_id is None:
                    assert record.skip_to is not None  # _planned_records: a dead record
                    mark_dead(store, name, record.number, record.skip_to, record.hollow)
                else:
                    write_segment(store, name, Segment(record.number, record.ledger_id,
                                                       record.max_before))


def _planned_records(segments: Iterable[Segment], start: int | None, end: int | None,
                     hollow: bool) -> Iterator[SegmentRecord]:
    """The records :func:`store_records` writes, in number order."""
    expected = start
    for segment in segments:
        if expected is not None and segment.number > expected:
            yield SegmentRecord(expected, None, segment.number, hollow)
        yield SegmentRecord(segment.number, segment.ledger_id, max_before=segment.max_before)
        expected = segment.number + 1
    if expected is not None and end is not None and end > expected:
        yield SegmentRecord(expected, None, end, hollow)


def ensure_records(store: MetadataStore, metadata: LogMetadata) -> None:
    """Write the records the head's tail segments and the gaps between them need and may
    lack (a writer died after its CAS); for a format-1 head, whose tail is the whole log,
    every record the log needs from truncated_before's segment on (its conversion)."""
    if metadata.format_version == 1:
        store_records(store, metadata.name, metadata.tail, metadata.truncated_before.segment,
                      metadata.next_segment, hollow=True)
    else:
        store_records(store, metadata.name, metadata.tail)


def mark_dropped(store: MetadataStore, metadata: LogMetadata) -> None:
    """Write the dead records of the head's dropped segments, each pointing at the next
    segment of the tail (the head is the one whose CAS dropped them)."""
    for dropped in metadata.dropping:
        if dropped.number is not None:
            after = next((s.number for s in metadata.tail if s.number > dropped.number),
                         metadata.next_segment)
            mark_dead(store, metadata.name, dropped.number, after)


def delete_records(store: MetadataStore, name: str, end: int,
                   delete_ledger: Callable[[int], None] | None = None) -> None:
    """Delete the records numbered from the stored head's oldest_segment up to ``end``
    (at most truncated_before's segment), in number order, calling ``delete_ledger``
    first with the ledger of each segment record; a hollow record goes in the same
    atomic step as the head's oldest_segment moves past its run (:func:`pass_hollow`),
    so no walk ever steps through the run's numbers ("Truncation" in the module
    docstring)."""
    number = read_log(store, name).metadata.oldest_segment
    while number < end:
        record = read_segment(store, name, number)
        if record is None:
            # Deleted by a walk that stopped, or by another walk going on meanwhile (an
            # opener's, a committer's), which may have passed a hollow run from here:
            # go on where the stored head's progress says, never through the run.
            try:
                number = max(number + 1, read_log(store, name).metadata.oldest_segment)
            except NoNode:
                return  # the log was deleted meanwhile (delete_log), its records first
            continue
        if record.ledger_id is not None and delete_ledger is not None:
            delete_ledger(record.ledger_id)
        if record.hollow:
            assert record.skip_to is not None  # from_bytes: a hollow record is dead
            pass_hollow(store, name, number, record.skip_to)
            number = record.skip_to
        else:
            delete_segment(store, name, number)
            number += 1


def pass_hollow(store: MetadataStore, name: str, number: int, skip_to: int) -> None:
    """Delete the hollow record of ``number`` and compare-and-set the head's
    oldest_segment up to its ``skip_to`` in one atomic step
    (:meth:`~pybk.meta.interface.MetadataStore.set_and_delete`); only the delete if the
    head is past it already.  The CAS changes that field only, so it is made again on
    whatever head it meets (at most PROGRESS_ATTEMPTS_MAX times), and it takes the log
    over from no one (:meth:`LogMetadata.same_owner`)."""
    for _ in range(PROGRESS_ATTEMPTS_MAX):
        head, version = read_log(store, name)
        if head.oldest_segment >= skip_to:
            delete_segment(store, name, number)
            return
        try:
            store.set_and_delete(log_path(name), dataclasses.replace(
                head, oldest_segment=skip_to).to_bytes(), version, segment_path(name, number))
            return
        except BadVersion:
            pass  # another change of the head: make this one again on it
    raise MetadataError(f"log {name}: lost the race to record truncation's progress "
                        f"{PROGRESS_ATTEMPTS_MAX} times in a row")


def delete_segment(store: MetadataStore, name: str, number: int) -> None:
    """Delete the record of segment ``number`` if it has one."""
    try:
        store.delete(segment_path(name, number), ANY_VERSION)
    except NoNode:
        pass


# -- finding segments -----------------------------------------------------------------


def find_segment(store: MetadataStore, metadata: LogMetadata, number: int) -> Segment | None:
    """The first segment of the log numbered ``number`` or more, as of the head
    ``metadata``; None if there is none (yet).  Never one read per number of a hollow
    run: see "Finding a segment" in the module docstring."""
    name = metadata.name
    target = number = max(number, metadata.truncated_before.segment)
    if metadata.format_version != 1:  # a format-1 tail is the whole log
        end = metadata.tail[0].number if metadata.tail else metadata.next_segment
        reached = number == metadata.truncated_before.segment  # by the walk of records
        while number < end:
            record = read_segment(store, name, number)
            if record is None:
                truncated = read_log(store, name).metadata.truncated_before.segment
                if truncated > number or not reached:
                    # Below a newer truncation, or maybe inside a hollow run: walk the
                    # records from truncated_before's segment to the target.
                    target, number, reached = max(target, truncated), truncated, True
                else:
                    number += 1  # a dead number whose record is being written
            elif record.ledger_id is None:
                assert record.skip_to is not None  # from_bytes: a dead record names it
                number, reached = record.skip_to, True
            elif number >= target:
                return Segment(number, record.ledger_id, record.max_before)
            else:
                number, reached = number + 1, True
        number = max(number, target)
    return next((s for s in metadata.tail if s.number >= number), None)


def live_segments(store: MetadataStore, metadata: LogMetadata) -> Iterator[Segment]:
    """Every segment of the log from truncated_before's on, in order (one record read per
    segment below the tail)."""
    number = metadata.truncated_before.segment
    while (segment := find_segment(store, metadata, number)) is not None:
        yield segment
        number = segment.number + 1
