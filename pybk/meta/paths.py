"""Record paths of the metadata contract, and BookKeeper's layout of them.

A path names one record, ZooKeeper style: ``/`` followed by one or more names joined by
``/`` (``/ledgers/L0000000007``).  A name is non-empty, is not ``.`` or ``..``, and holds
no ``/`` and no NUL; a path is at most :data:`MAX_PATH_BYTES` bytes of UTF-8.  The root
``/`` is not a record: it always exists, has children, and can be watched, but cannot be
created, read, set or deleted.

BookKeeper's layout of a cluster under ``/ledgers``:

``/ledgers/<ledger path>``               one ledger's metadata, at the path the store's
                                         ledger layout gives (:mod:`pybk.meta.layout`)
``/ledgers/available/<bookie id>``       a writable bookie's registration (ephemeral)
``/ledgers/available/readonly/<id>``     a read-only bookie's registration (ephemeral)
``/ledgers/hosts/<host>/<bookie id>``    a registered bookie's host (ephemeral, beside
                                         its registration; pybk's: placement finds the
                                         bookies of a writer's host in one read)
``/ledgers/locations/<bookie id>``       a registered bookie's network location,
                                         ``/region/rack`` as UTF-8 (ephemeral, made
                                         before its registration; pybk's: none for a
                                         bookie without one, which readers take as the
                                         default rack, so older bookies and readers
                                         work on)
``/ledgers/spark-bookies/<lease>/...``   bookies hosted by a Spark application's
                                         executors: its driver's lease and what each
                                         holding task reports (:mod:`pybk.spark.bookies`)
``/ledgers/cookies/<bookie id>``         a bookie's cookie (its instance and directories;
                                         :mod:`pybk.meta.cookies`)
``/ledgers/idgen/ID-<10 digits>``        ZooKeeper's ledger id generator (sequential)
``/ledgers/INSTANCEID``                  the cluster's instance id (a UUID, text)
``/ledgers/LAYOUT``                      the ledger layout, in BookKeeper's text form
``/ledgers/underreplication/...``        under-replicated ledgers, replication claims,
                                         the auditor election
                                         (:mod:`pybk.meta.underreplication`)

pybk's own records live outside ``/ledgers``: the logs, ``/logs/<name>/...``
(:mod:`pybk.log.metadata`), and an embedded WAL's promotion records ``/pybk/...``
(:mod:`pybk.log.promotion`).  The ZooKeeper store keeps them under the cluster's root
too, in its node ``pybk`` (:mod:`pybk.meta.zookeeper`), so that clusters sharing one
ZooKeeper share nothing.
"""

from __future__ import annotations

from pybk.errors import InvalidLedgerId, MetadataError

ROOT = "/"
LEDGERS = "/ledgers"
AVAILABLE = "/ledgers/available"
READONLY_NAME = "readonly"
READONLY = f"{AVAILABLE}/{READONLY_NAME}"
HOSTS = "/ledgers/hosts"
LOCATIONS = "/ledgers/locations"
SPARK_BOOKIES = "/ledgers/spark-bookies"
COOKIES = "/ledgers/cookies"
IDGEN = "/ledgers/idgen"
INSTANCE_ID = "/ledgers/INSTANCEID"
LAYOUT = "/ledgers/LAYOUT"

# LMDB keys are at most 511 bytes and the embedded store's key is the path plus one byte;
# ZooKeeper has a larger limit, and the contract holds every store to the smaller one.
MAX_PATH_BYTES = 500


def check_name(name: str) -> str:
    """``name`` if it can be one component of a path, else MetadataError."""
    if not isinstance(name, str) or not name or name in (".", "..") \
            or "/" in name or "\0" in name:
        raise MetadataError(f"{name!r} is not a valid record name: it must be a non-empty "
                            "string without '/' or NUL, and not '.' or '..'")
    return name


def check_path(path: str, root_ok: bool = False) -> str:
    """``path`` if it is a valid record path (or the root, when ``root_ok``)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise MetadataError(f"{path!r} is not a path: paths are strings starting with '/'")
    if path == ROOT:
        if root_ok:
            return path
        raise MetadataError("the root '/' is not a record; name a path below it")
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise MetadataError(f"path {path!r} is not encodable as UTF-8") from None
    if size > MAX_PATH_BYTES:
        raise MetadataError(f"path {path[:60]!r}... is {size} bytes long, over "
                            f"MAX_PATH_BYTES={MAX_PATH_BYTES}")
    for name in path[1:].split("/"):
        try:
            check_name(name)
        except MetadataError as e:
            raise MetadataError(f"path {path!r}: {e}") from None
    return path


def split(path: str) -> tuple[str, str]:
    """``(parent, name)`` of a valid non-root path: ``/a/b`` -> ``("/a", "b")``."""
    parent, _, name = path.rpartition("/")
    return parent or ROOT, name


def join(parent: str, name: str) -> str:
    return (parent if parent != ROOT else "") + "/" + name


def ancestors(path: str) -> list[str]:
    """The record paths above a valid non-root path, top first: ``/a/b/c`` -> ``/a, /a/b``."""
    names = path[1:].split("/")[:-1]
    return ["/" + "/".join(names[:i]) for i in range(1, len(names) + 1)]


def host_bookie(host: str, bookie_id: str) -> str:
    """The record saying that ``bookie_id`` is registered on ``host``."""
    return join(join(HOSTS, host), bookie_id)


#: Ledger ids are BookKeeper's: Java longs that are not negative.
LEDGER_ID_MAX = 2 ** 63 - 1


def check_ledger_id(ledger_id: int) -> int:
    """``ledger_id`` if a ledger may have it (an integer in [0, 2^63)), else
    InvalidLedgerId: a caller's mistake, not the store's."""
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) \
            or not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise InvalidLedgerId(f"ledger id {ledger_id!r} is not an integer in [0, 2^63)")
    return ledger_id
