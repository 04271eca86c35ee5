"""BookKeeper's HTTP admin endpoints, served by a bookie process (a
:class:`~pybk.cluster.node.BookieNode` with ``httpServerEnabled``: what the endpoints ask
of it is :class:`AdminNode`), and the status page at ``/``.

The work is the admin shell's (:mod:`pybk.admin.commands`,
:mod:`~pybk.admin.inspect`, :mod:`~pybk.admin.recover`) on the node's own metadata store
(its ZooKeeper session) or, for the endpoints that read or delete ledgers, on a ledger
client of the cluster opened for the request.  Paths, methods, parameters and JSON keys
are BookKeeper's (``org.apache.bookkeeper.server.http.service``); where BookKeeper answers
plain text, pybk answers ``{"message": that text, ...the values}``, and ``/heartbeat`` and
``/api/v1/bookie/is_ready`` keep BookKeeper's text for probes.  Privileged (the admin
token): every method but GET, and ``/api/v1/ledger/read`` (it reads the ledgers' data).
Numbers in a query (``ledger_id``, entry ids, ``page``) and in a body are checked against
their range: a value out of it, negative where that means nothing, or not a number is a
400 naming the parameter, never a 5xx.

GET  /heartbeat                      ``OK``
GET  /api/v1/config/server_config    the settings (secrets shown as ``******``)
GET  /api/v1/bookie/info             ``{"freeSpace", "totalSpace"}`` + pybk's
                                     ``"bookieId"``, ``"readOnly"`` and ``"requests"``
                                     (served since the start, by operation)
GET  /api/v1/bookie/state            ``{"running", "readOnly", "shuttingDown",
                                     "availableForHighPriorityWrites"}``
GET  /api/v1/bookie/is_ready         200 ``OK``, or 503
GET  /api/v1/bookie/sanity           ``{"passed", "readOnly"}``: a ledger of 10 entries
                                     written to this bookie (E=1; another one if it
                                     is read-only), read back and deleted
                                     (``pybk simpletest``)
GET  /api/v1/bookie/last_log_mark    ``{"LastLogMark: Journal Id - <id>(<file>)":
                                     "Pos - <offset>"}``
GET  /api/v1/bookie/list_disk_file   ``{"journal files", "entrylog files", "index
     ?file_type=journal|entrylog|index   files"}``: names separated by tabs
GET  /api/v1/bookie/gc               ``{"is_in_force_gc": "true"|"false"}``
PUT  /api/v1/bookie/gc               start a GC with major compaction; same answer
GET  /api/v1/bookie/gc_details       ``[{"forceCompacting", "majorCompacting",
                                     "minorCompacting", "lastMajorCompactionTime",
                                     "lastMinorCompactionTime", "majorCompactionCounter",
                                     "minorCompactionCounter"}]``
GET  /api/v1/bookie/gc/suspend_compaction  ``{"isMajorGcSuspended",
                                     "isMinorGcSuspended"}`` (``"true"``/``"false"``)
PUT  /api/v1/bookie/gc/suspend_compaction  body ``{"suspendMajor": "true", "suspendMinor":
                                     "true"}`` (either; true or "true"): start no more
                                     compactions of that kind, scheduled or forced, until
                                     resumed (not kept across a restart); the same answer
PUT  /api/v1/bookie/gc/resume_compaction   body ``{"resumeMajor": .., "resumeMinor": ..}``
GET  /api/v1/bookie/state/readonly   ``{"readOnly"}``
PUT  /api/v1/bookie/state/readonly   body ``{"readOnly": bool}``: refuse adds and
                                     register read-only, or undo it
GET  /api/v1/bookie/list_bookies     ``{bookie id: host or null}``; ``type=rw|ro``
     ?type=rw|ro&print_hostnames=true    (default: both)
GET  /api/v1/bookie/list_bookie_info ``{bookie id: ": {Free: n(..), Total: n(..)}",
                                     "ClusterInfo: ": "{Free: .., Total: ..}"}``
GET  /api/v1/bookie/cluster_info     ``{"auditorElected", "auditorId",
                                     "clusterUnderReplicated", "ledgerReplicationEnabled",
                                     "totalBookiesCount", "writableBookiesCount",
                                     "readonlyBookiesCount", "unavailableBookiesCount"}`` +
                                     ``"pybk"``: ``pybk clusterinfo --json``
GET  /api/v1/ledger/list             ``{ledger id: metadata or null}``; ``page`` N
     ?print_metadata=true&page=N         (from 1) of :data:`LEDGER_PAGE` ledgers, in the
                                     listing's order (:mod:`pybk.meta.layout`), with or
                                     without metadata (BookKeeper pages only with it);
                                     without ``page`` every ledger, in one reply
GET  /api/v1/ledger/metadata         ``{ledger id: metadata}`` (``pybk ledgermetadata``)
     ?ledger_id=N
GET  /api/v1/ledger/read             ``{entry id: payload as UTF-8 text}``, at most
     ?ledger_id=N&start_entry_id=&end_entry_id=   :data:`READ_ENTRIES_MAX` entries
DELETE /api/v1/ledger/delete?ledger_id=N  ``{"deleted": id}``
GET  /api/v1/autorecovery/status     ``{"enabled"}``; PUT ``?enabled=true|false``
GET  /api/v1/autorecovery/list_under_replicated_ledger  ``[id, ...]``, or with
     ?missingreplica=&excludingmissingreplica=&printmissingreplica=true
                                     ``{id: [missing bookies]}``; 404 if none
GET  /api/v1/autorecovery/who_is_auditor  ``{"Auditor": id}``; 404 if none
PUT  /api/v1/autorecovery/trigger_audit   ``{"message", "triggered", "auditor"}``
GET  /api/v1/autorecovery/lost_bookie_recovery_delay  ``{"message", "delay_seconds"}``;
                                     PUT body ``{"delay_seconds": N}``
PUT  /api/v1/autorecovery/decommission    body ``{"bookie_src": id, "timeout_s": s}``:
                                     waits (at most ``timeout_s``, default 60) as
                                     ``pybk decommission`` does; its JSON
PUT  /api/v1/autorecovery/bookie     body ``{"bookie_src": [id, ...], "delete_cookie":
                                     bool}``: ``pybk recover`` run here; its JSON
GET  /api/v1/pybk/bookie_info        pybk's: ``pybk bookieinfo --json`` (each bookie's
                                     state and disk use, asked over the wire)
GET  /                               the status page (one HTML page, no other assets)
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.resources
import itertools
import os
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from pybk.admin import commands as admin
from pybk.admin import inspect as admin_inspect
from pybk.admin import recover as recover_commands
from pybk.errors import BookKeeperError, NoSuchLedger
from pybk.http.server import HttpError, Request, Response, Routes
from pybk.meta import paths
from pybk.meta.ledgers import LedgerManager
from pybk.storage.journal_codec import journal_file_name, list_journal_ids
from pybk.storage.lastmark import read_mark

if TYPE_CHECKING:
    from pybk.meta.interface import MetadataStore
    from pybk.net.server import BookieServer
    from pybk.settings import ServerSettings
    from pybk.storage import Bookie

#: Ledgers on one page of ``/api/v1/ledger/list?page=N``.
LEDGER_PAGE = 100
#: The highest entry id (a Java long).
ENTRY_ID_MAX = 2 ** 63 - 1
#: Most entries one ``/api/v1/ledger/read`` answers (a longer range is cut there).
READ_ENTRIES_MAX = 1000
#: Seconds ``list_bookie_info`` and ``bookie_info`` wait for the bookies together.
BOOKIE_INFO_TIMEOUT_S = 5.0
#: The highest ``page`` of ``/api/v1/ledger/list`` (ZooKeeper's ledger ids are 31-bit).
PAGE_MAX = 2 ** 31 - 1
#: The longest ``lostBookieRecoveryDelay`` that may be set, in seconds (a Java int).
DELAY_MAX_S = 2 ** 31 - 1
#: The longest ``timeout_s`` a decommission request may ask for.
DECOMMISSION_TIMEOUT_MAX_S = 3600.0
_SECRETS = ("httpServerAdminToken", "bookieRecoveryPasswd")
_COMMAND = "http"  # the name progress lines of recover and decommission go under


class AdminNode(Protocol):
    """What the endpoints ask of the bookie process they serve: a
    :class:`~pybk.cluster.node.BookieNode`, which is above this package."""

    @property
    def settings(self) -> ServerSettings: ...

    @property
    def bookie(self) -> Bookie: ...

    @property
    def bookie_id(self) -> str: ...

    @property
    def metadata(self) -> MetadataStore:
        """The node's store (its ZooKeeper session), which the admin endpoints use."""
        ...

    @property
    def server(self) -> BookieServer: ...

    @property
    def is_closed(self) -> bool: ...

    def set_read_only_by_admin(self, read_only: bool) -> None:
        """``PUT /api/v1/bookie/state/readonly``."""
        ...


def admin_routes(node: AdminNode) -> Routes:
    """The route table of ``node``'s admin server: every endpoint above."""
    endpoints = _Endpoints(node)
    routes = Routes()
    get: list[tuple[str, Callable[[Request], Any]]] = [
        ("/", endpoints.status_page),
        ("/heartbeat", lambda _r: Response.text("OK\n")),
        ("/api/v1/config/server_config", endpoints.server_config),
        ("/api/v1/bookie/info", endpoints.info),
        ("/api/v1/bookie/state", endpoints.state),
        ("/api/v1/bookie/is_ready", endpoints.is_ready),
        ("/api/v1/bookie/sanity", endpoints.sanity),
        ("/api/v1/bookie/last_log_mark", endpoints.last_log_mark),
        ("/api/v1/bookie/list_disk_file", endpoints.list_disk_file),
        ("/api/v1/bookie/gc", endpoints.gc),
        ("/api/v1/bookie/gc_details", endpoints.gc_details),
        ("/api/v1/bookie/gc/suspend_compaction", endpoints.suspend_compaction),
        ("/api/v1/bookie/state/readonly", endpoints.read_only),
        ("/api/v1/bookie/list_bookies", endpoints.list_bookies),
        ("/api/v1/bookie/list_bookie_info", endpoints.list_bookie_info),
        ("/api/v1/bookie/cluster_info", endpoints.cluster_info),
        ("/api/v1/ledger/list", endpoints.list_ledgers),
        ("/api/v1/ledger/metadata", endpoints.ledger_metadata),
        ("/api/v1/autorecovery/status", endpoints.autorecovery_status),
        ("/api/v1/autorecovery/list_under_replicated_ledger", endpoints.underreplicated),
        ("/api/v1/autorecovery/who_is_auditor", endpoints.who_is_auditor),
        ("/api/v1/autorecovery/lost_bookie_recovery_delay", endpoints.delay),
        ("/api/v1/pybk/bookie_info", endpoints.bookie_info),
    ]
    for path, handler in get:
        routes.add(path, "GET", handler)
    routes.add("/api/v1/ledger/read", "GET", endpoints.read_ledger, privileged=True)
    for method, path, handler in [
        ("PUT", "/api/v1/bookie/gc", endpoints.gc),
        ("PUT", "/api/v1/bookie/gc/suspend_compaction", endpoints.suspend_compaction),
        ("PUT", "/api/v1/bookie/gc/resume_compaction", endpoints.resume_compaction),
        ("PUT", "/api/v1/bookie/state/readonly", endpoints.read_only),
        ("DELETE", "/api/v1/ledger/delete", endpoints.delete_ledger),
        ("PUT", "/api/v1/autorecovery/status", endpoints.autorecovery_status),
        ("PUT", "/api/v1/autorecovery/trigger_audit", endpoints.trigger_audit),
        ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay", endpoints.delay),
        ("PUT", "/api/v1/autorecovery/decommission", endpoints.decommission),
        ("PUT", "/api/v1/autorecovery/bookie", endpoints.recover),
    ]:
        routes.add(path, method, handler, privileged=True)
    return routes


class _Endpoints:
    """The handlers, on one node."""

    def __init__(self, node: AdminNode) -> None:
        self.node = node
        self.bookie = node.bookie
        self.store = node.metadata
        self.target = admin.target(node.settings)

    # -- this bookie ----------------------------------------------------------------------

    def status_page(self, _r: Request) -> Response:
        page = importlib.resources.files("pybk.http").joinpath("status_page.html")
        return Response.text(page.read_text(encoding="utf-8"), content_type="text/html")

    def server_config(self, _r: Request) -> dict:
        values = dataclasses.asdict(self.node.settings)
        for name in _SECRETS:
            values[name] = "******" if values[name] else ""
        return values

    def info(self, _r: Request) -> dict:
        free, total = self.bookie.disk_space()
        return {"freeSpace": free, "totalSpace": total, "bookieId": self.node.bookie_id,
                "readOnly": self.bookie.is_read_only,
                "requests": self.node.server.requests_served()}

    def state(self, _r: Request) -> dict:
        running = not (self.node.is_closed or self.bookie.is_closed)
        return {"running": running, "readOnly": self.bookie.is_read_only,
                "shuttingDown": not running,
                "availableForHighPriorityWrites": running and not self.bookie.is_read_only}

    def is_ready(self, _r: Request) -> Response:
        if self.node.is_closed or self.bookie.is_closed:
            return Response.text("Bookie is not running\n", 503)
        return Response.text("OK\n")

    def sanity(self, _r: Request) -> dict:
        from pybk.admin.simpletest import simple_test
        from pybk.meta.zookeeper import ZooKeeperSettings
        from pybk.net.curve import client_settings_of
        from pybk.settings import ClientSettings

        settings = self.node.settings  # the bookie's own credentials
        try:
            simple_test(self.target.address, 1, 1, 1, entries=10, entry_bytes=64,
                        settings=ClientSettings(**client_settings_of(settings)),
                        local_bookies={self.node.bookie_id: self.bookie},
                        zk_settings=ZooKeeperSettings.of(settings))
            passed = True
        except BookKeeperError:
            passed = False
        return {"passed": passed, "readOnly": self.bookie.is_read_only}

    def last_log_mark(self, _r: Request) -> dict:
        mark = read_mark(list(self.node.settings.ledgerDirectories))
        return {f"LastLogMark: Journal Id - {mark.journal_id}"
                f"({journal_file_name(mark.journal_id)})": f"Pos - {mark.offset}"}

    def list_disk_file(self, r: Request) -> dict:
        wanted = r.param("file_type")
        kinds = {"journal": self._journal_files, "entrylog": self._entry_log_files,
                 "index": self._index_files}
        if wanted is not None and wanted not in kinds:
            raise HttpError(400, f"file_type must be one of {', '.join(kinds)}, not "
                                 f"{wanted!r}")
        return {f"{kind} files": "\t".join(list_files())
                for kind, list_files in kinds.items() if wanted in (None, kind)}

    def _journal_files(self) -> list[str]:
        return [journal_file_name(i) for i in list_journal_ids(self.bookie.journal_dir)]

    def _entry_log_files(self) -> list[str]:
        from pybk.storage.entrylog import SUFFIX
        return sorted(name for d in self.node.settings.ledgerDirectories
                      for name in _listdir(os.path.join(d, "current"))
                      if name.endswith(SUFFIX))

    def _index_files(self) -> list[str]:
        return _listdir(os.path.join(self.node.settings.ledgerDirectories[0], "current",
                                     "index"))

    def gc(self, r: Request) -> dict:
        if r.method == "PUT":
            self.bookie.request_gc()
        return {"is_in_force_gc": str(self.bookie.is_in_force_gc).lower()}

    def suspend_compaction(self, r: Request) -> dict:
        if r.method == "PUT":
            body = r.json()
            self.bookie.suspend_compaction(major=_flag(body, "suspendMajor"),
                                           minor=_flag(body, "suspendMinor"))
        return self._suspension()

    def resume_compaction(self, r: Request) -> dict:
        body = r.json()
        self.bookie.resume_compaction(major=_flag(body, "resumeMajor"),
                                      minor=_flag(body, "resumeMinor"))
        return self._suspension()

    def _suspension(self) -> dict:
        s = self.bookie.gc_status
        return {"isMajorGcSuspended": str(s.major_suspended).lower(),
                "isMinorGcSuspended": str(s.minor_suspended).lower()}

    def gc_details(self, _r: Request) -> list[dict]:
        s = self.bookie.gc_status
        return [{"forceCompacting": s.forced, "majorCompacting": s.compacting == "major",
                 "minorCompacting": s.compacting == "minor",
                 "lastMajorCompactionTime": s.last_major_ms,
                 "lastMinorCompactionTime": s.last_minor_ms,
                 "majorCompactionCounter": s.major_count,
                 "minorCompactionCounter": s.minor_count}]

    def read_only(self, r: Request) -> dict:
        if r.method == "PUT":
            wanted = r.json().get("readOnly")
            if not isinstance(wanted, bool):
                raise HttpError(400, 'the body must be {"readOnly": true|false}')
            self.node.set_read_only_by_admin(wanted)
        return {"readOnly": self.bookie.is_read_only}

    # -- the cluster's bookies --------------------------------------------------------------

    def list_bookies(self, r: Request) -> dict:
        kind = r.param("type")
        if kind not in (None, "rw", "ro"):
            raise HttpError(400, f"type must be rw or ro, not {kind!r}")
        hostnames = r.bool_param("print_hostnames")
        found = admin.list_bookies(None if kind is None else kind == "ro")(self.store)
        return {b["bookie"]: _host(b["endpoint"]) if hostnames else None for b in found}

    def list_bookie_info(self, _r: Request) -> dict:
        info = admin_inspect.bookie_info(BOOKIE_INFO_TIMEOUT_S)(self.store)
        found = {b["bookie"]: ": " + _free_total(b["free_bytes"], b["total_bytes"])
                 for b in info["bookies"] if b["error"] is None}
        found["ClusterInfo: "] = _free_total(info["free_bytes"], info["total_bytes"])
        return found

    def bookie_info(self, _r: Request) -> dict:
        return admin_inspect.bookie_info(BOOKIE_INFO_TIMEOUT_S)(self.store)

    def cluster_info(self, _r: Request) -> dict:
        info = admin.cluster_info(self.store)
        writable, read_only, lost = info["writable"], info["read_only"], info["lost"]
        return {"auditorElected": info["auditor"] is not None,
                "auditorId": info["auditor"] or "",
                "clusterUnderReplicated": info["underreplicated"] > 0,
                "ledgerReplicationEnabled": info["autorecovery"],
                "totalBookiesCount": len(writable) + len(read_only) + len(lost),
                "writableBookiesCount": len(writable),
                "readonlyBookiesCount": len(read_only),
                "unavailableBookiesCount": len(lost),
                "pybk": info}

    # -- ledgers ----------------------------------------------------------------------------

    def list_ledgers(self, r: Request) -> dict:
        with_metadata = r.bool_param("print_metadata")
        page = r.int_param("page", 1, PAGE_MAX)
        manager = LedgerManager(self.store)
        ids: Iterator[int] = manager.iter_ledger_ids()
        if page is not None:
            # The listing is read up to the page's end only: one page of metadata, and
            # the ids before it (the same order every time: pybk.meta.layout).
            ids = itertools.islice(ids, (page - 1) * LEDGER_PAGE, page * LEDGER_PAGE)
        found: dict[str, Any] = {}
        for ledger_id in ids:
            if not with_metadata:
                found[str(ledger_id)] = None
                continue
            try:
                found[str(ledger_id)] = admin.describe(manager.read(ledger_id).metadata)
            except NoSuchLedger:
                pass  # deleted meanwhile
        return found

    def ledger_metadata(self, r: Request) -> dict:
        ledger_id = _ledger_id(r)
        return {str(ledger_id): admin.ledger_metadata(ledger_id)(self.store)}

    def read_ledger(self, r: Request) -> dict:
        ledger_id = _ledger_id(r)
        first = r.int_param("start_entry_id", 0, ENTRY_ID_MAX, default=0)
        last = r.int_param("end_entry_id", -1, ENTRY_ID_MAX)  # -1: to the end
        assert first is not None
        last = first + READ_ENTRIES_MAX - 1 if last is None or last < 0 else \
            min(last, first + READ_ENTRIES_MAX - 1)
        if last < first:
            raise HttpError(400, f"end_entry_id {last} is before start_entry_id {first}")
        with admin.client(self.target) as bk:
            result = admin_inspect.read_ledger(ledger_id, first, last, None,
                                               self.target.password)(bk)
        return {str(e["entry"]): _payload_text(e["payload_base64"])
                for e in result["entries"]}

    def delete_ledger(self, r: Request) -> dict:
        ledger_id = _ledger_id(r)
        with admin.client(self.target) as bk:
            return admin.delete_ledger(ledger_id)(bk)

    # -- autorecovery -----------------------------------------------------------------------

    def autorecovery_status(self, r: Request) -> dict:
        action = "status"
        if r.method == "PUT":
            if r.param("enabled") is None:
                raise HttpError(400, "give enabled=true or enabled=false")
            action = "enable" if r.bool_param("enabled") else "disable"
        return admin.autorecovery(action)(self.store)

    def underreplicated(self, r: Request) -> Any:
        included, excluded = r.param("missingreplica"), r.param("excludingmissingreplica")
        found = [m for m in admin.list_underreplicated(self.store)
                 if (not included or included in m["missing"])
                 and (not excluded or excluded not in m["missing"])]
        if not found:
            raise HttpError(404, "No under replicated ledgers found")
        if r.bool_param("printmissingreplica"):
            return {str(m["ledger"]): m["missing"] for m in found}
        return [m["ledger"] for m in found]

    def who_is_auditor(self, _r: Request) -> dict:
        auditor = admin.who_is_auditor(self.store)["auditor"]
        if auditor is None:
            raise HttpError(404, "No auditor elected")
        return {"Auditor": auditor}

    def trigger_audit(self, _r: Request) -> dict:
        return {"message": "Success trigger audit by admin",
                **admin.trigger_audit(self.store)}

    def delay(self, r: Request) -> dict:
        seconds = None
        if r.method == "PUT":
            seconds = r.json().get("delay_seconds")
            if not isinstance(seconds, int) or isinstance(seconds, bool) or \
                    not 0 <= seconds <= DELAY_MAX_S:
                raise HttpError(400, 'the body must be {"delay_seconds": N}, '
                                     f'0 <= N <= {DELAY_MAX_S}')
        result = admin.lost_bookie_recovery_delay(seconds)(self.store)
        verb = "Successfully update lostBookieRecoveryDelay to" if result["set"] else \
            "lostBookieRecoveryDelay value:"
        return {"message": f"{verb} {result['seconds']}", "delay_seconds": result["seconds"]}

    def decommission(self, r: Request) -> dict:
        body = r.json()
        bookie = body.get("bookie_src")
        timeout_s = body.get("timeout_s", 60)
        if not isinstance(bookie, str) or not bookie:
            raise HttpError(400, 'the body must name the bookie: {"bookie_src": "<id>"}')
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or \
                not 0 < timeout_s <= DECOMMISSION_TIMEOUT_MAX_S:
            raise HttpError(400, f"timeout_s must be a number of seconds in (0, "
                                 f"{DECOMMISSION_TIMEOUT_MAX_S:.0f}]")
        return recover_commands.decommission(_COMMAND, self.store, bookie, float(timeout_s))

    def recover(self, r: Request) -> Any:
        body = r.json()
        bookies = body.get("bookie_src")
        delete_cookie = body.get("delete_cookie", False)
        if isinstance(bookies, str):
            bookies = [bookies]
        if not (isinstance(bookies, list) and bookies
                and all(isinstance(b, str) and b for b in bookies)):
            raise HttpError(400, 'the body must name the bookies: {"bookie_src": ["<id>", '
                                 '...], "delete_cookie": false}')
        if not isinstance(delete_cookie, bool):
            raise HttpError(400, "delete_cookie must be true or false")
        with admin.client(self.target) as bk:
            return recover_commands.recover(_COMMAND, bk, self.node.settings,
                                            list(dict.fromkeys(bookies)),
                                            delete_cookie=delete_cookie)


def _ledger_id(r: Request) -> int:
    ledger_id = r.int_param("ledger_id", 0, paths.LEDGER_ID_MAX)
    if ledger_id is None:
        raise HttpError(400, "give the ledger: ?ledger_id=N")
    return ledger_id


def _flag(body: dict, name: str) -> bool:
    """A body's boolean ``name``, given as BookKeeper's clients give it (``"true"`` /
    ``"false"``) or as JSON's; absent is false; 400 otherwise."""
    value = body.get(name, False)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise HttpError(400, f'{name} must be true or false (or "true" / "false"), '
                             f"not {value!r}")
    return value


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _host(endpoint: str | None) -> str | None:
    """``tcp://host:port`` -> ``host``."""
    if not endpoint:
        return None
    return endpoint.split("://", 1)[-1].rpartition(":")[0] or None


def _free_total(free: int, total: int) -> str:
    return (f"{{Free: {free}({admin_inspect.human_bytes(free)}), "
            f"Total: {total}({admin_inspect.human_bytes(total)})}}")


def _payload_text(payload_base64: str) -> str:
    return base64.b64decode(payload_base64).decode("utf-8", errors="replace")
