"""Security: ZeroMQ CURVE between clients and bookies, ZooKeeper digest ACLs on pybk's
znodes, and what a ledger password guards (docs/guide/security.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import urllib.request

import pytest
import zkutil
from autorecoveryutil import FAST as AUTORECOVERY_FAST
from autorecoveryutil import check_replicas, repaired, write_ledger
from clientutil import CURVE, FAST, clusters
from clusterutil import PASSWORD as CLUSTER_PASSWORD
from clusterutil import failed, ok, pybk
from conftest import KEY, entry
from curveutil import make_keys
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from securityutil import secured_cluster_of_bookies, zookeeper_credentials

from pybk import connect
from pybk import open as pybk_open
from pybk.client import BookKeeper
from pybk.client.digest import DigestManager
from pybk.errors import (
    BookieUnavailable,
    BookKeeperError,
    DigestMismatch,
    InvalidConfiguration,
    MetadataError,
    Unauthorized,
)
from pybk.meta.ledger_metadata import DigestType
from pybk.meta.underreplication import UnderreplicationManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore, ZooKeeperSettings, format_cluster
from pybk.net import BookieServer, ZmqBookieClient
from pybk.net.curve import load_key_pair
from pybk.settings import ClientSettings
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(60)

#: Time limits far longer than any test step: a prompt failure cannot be a timeout.
#: Time limits a refusal must not wait for (ten minutes): a prompt refusal is told from
#: a timeout by its error, never by how long it took.
PATIENT = ClientSettings(addEntryTimeout=600, readTimeout=600)
#: A refused handshake must fail requests this fast (well within any time limit).
PROMPT_S = 60.0


@pytest.fixture
def keys(tmp_path):
    return make_keys(str(tmp_path / "keys"))


@pytest.fixture
def curve_server(keys, bookie_factory, settings_factory, closing):
    """A bookie serving CURVE, holding entry 0 of ledger 1."""
    bookie = bookie_factory(settings_factory(**keys.server()))
    bookie.add_entry(1, 0, entry(1, 0, lac=-1), KEY)
    return closing.enter_context(BookieServer(bookie, "tcp://127.0.0.1:*"))


def test_an_allowed_client_pinning_the_bookie_key_reads_and_writes(keys, curve_server,
                                                                   closing):
    client = closing.enter_context(ZmqBookieClient(
        "B1", curve_server.address, keys.client(PATIENT), server_key=keys.bookie_public))
    assert curve_server.public_key == keys.bookie_public
    assert client.read(1, 0).result(timeout=WAIT_S) == entry(1, 0, lac=-1)
    client.add(1, 1, entry(1, 1, lac=0), KEY).result(timeout=WAIT_S)
    assert client.read(1, 1).result(timeout=WAIT_S) == entry(1, 1, lac=0)


def refused_promptly(client: ZmqBookieClient) -> None:
    """Every kind of request fails with BookieUnavailable, long before its time limit."""
    calls = [client.read(1, 0), client.add(1, 5, entry(1, 5, lac=-1), KEY),
             client.read_lac(1)]
    for call in calls:
        error = call.exception(timeout=PROMPT_S)
        assert isinstance(error, BookieUnavailable), error
        assert "handshake" in str(error) or "connection" in str(error), error


def test_a_client_without_keys_is_refused_promptly(curve_server, closing):
    client = closing.enter_context(ZmqBookieClient("B1", curve_server.address, PATIENT))
    refused_promptly(client)


def test_a_client_with_a_key_the_bookie_does_not_allow_is_refused_promptly(
        keys, curve_server, closing):
    client = closing.enter_context(ZmqBookieClient(
        "B1", curve_server.address, keys.client(PATIENT, keys.stranger_secret),
        server_key=keys.bookie_public))
    refused_promptly(client)


def test_a_client_pinning_another_bookie_key_is_refused_promptly(keys, curve_server,
                                                                 closing):
    # The stranger's public key stands for a process that took the bookie's address.
    other = load_key_pair(keys.stranger_secret).public
    client = closing.enter_context(ZmqBookieClient(
        "B1", curve_server.address, keys.client(PATIENT), server_key=other))
    refused_promptly(client)


def test_curve_on_one_side_only_is_refused_when_the_client_is_made(keys):
    with pytest.raises(BookieUnavailable, match="registered no CURVE key"):
        ZmqBookieClient("B1", "tcp://127.0.0.1:1", keys.client(PATIENT))
    with pytest.raises(BookieUnavailable, match="requires CURVE"):
        ZmqBookieClient("B1", "tcp://127.0.0.1:1", PATIENT, server_key=keys.bookie_public)


# -- ZooKeeper: digest authentication and ACLs ------------------------------------------


def every_znode(client: KazooClient, path: str) -> list[str]:
    found = [path]
    for child in client.get_children(path):
        found += every_znode(client, f"{path.rstrip('/')}/{child}")
    return found


def secured_cluster(zookeeper, settings) -> tuple[str, str]:
    """A fresh cluster formatted with ``settings``: its address and ZooKeeper root."""
    root = zkutil.fresh_root()
    address = zookeeper.address(root)
    format_cluster(address, settings=settings)
    return address, root


def test_without_credentials_no_client_can_change_pybk_znodes(zookeeper, kazoo,
                                                              tmp_path):
    settings = zookeeper_credentials(tmp_path)
    address, root = secured_cluster(zookeeper, settings)
    with ZooKeeperMetadataStore(address, settings) as store:
        store.register_bookie("b1", False, "tcp://127.0.0.1:3181", "host1")
        store.create("/ledgers/00/0000/L0001", b"metadata")
        znodes = every_znode(kazoo, root)
        assert len(znodes) > 8, znodes  # layout, instance id, available/b1, ledgers...
        for znode in znodes:
            kazoo.get(znode)  # world-readable (the default)
            with pytest.raises(NoAuthError):
                kazoo.set(znode, b"changed")
            with pytest.raises(NoAuthError):
                kazoo.create(f"{znode}/intruder", b"")
            if not kazoo.get_children(znode):
                with pytest.raises(NoAuthError):
                    kazoo.delete(znode)
        # pybk itself, with the credentials, still changes what it created.
        store.set("/ledgers/00/0000/L0001", b"changed", 0)
        store.unregister_bookie("b1", "host1")
    # A pybk store without credentials reads the cluster, and cannot change it.
    with ZooKeeperMetadataStore(address, zkutil.settings()) as plain:
        assert plain.get("/ledgers/00/0000/L0001")[0] == b"changed"
        with pytest.raises(MetadataError, match="(?i)auth"):
            plain.register_bookie("b2", False, "tcp://127.0.0.1:3182")


def test_a_cluster_not_world_readable_hides_its_znodes_from_clients_without_credentials(
        zookeeper, kazoo, tmp_path):
    settings = zookeeper_credentials(tmp_path, world_readable=False)
    address, root = secured_cluster(zookeeper, settings)
    with pytest.raises(NoAuthError):
        kazoo.get(f"{root}/LAYOUT")
    with ZooKeeperMetadataStore(address, settings) as store:  # pybk reads it
        assert store.bookies() == []


def test_bad_zookeeper_credentials_settings_are_one_clear_error(zookeeper, tmp_path):
    address = zookeeper.address(zkutil.fresh_root())
    with pytest.raises(InvalidConfiguration, match="zkDigestAuthFile"):
        ZooKeeperSettings(zkEnableSecurity=True)
    missing = dataclasses.replace(zkutil.settings(), zkEnableSecurity=True,
                                  zkDigestAuthFile=str(tmp_path / "missing"))
    with pytest.raises(InvalidConfiguration, match="zkDigestAuthFile=.*missing"):
        ZooKeeperMetadataStore(address, missing)
    (tmp_path / "bad").write_text("no-colon-here\n")
    with pytest.raises(InvalidConfiguration, match="user:password"):
        ZooKeeperMetadataStore(address, dataclasses.replace(
            missing, zkDigestAuthFile=str(tmp_path / "bad")))


# -- ledger passwords ---------------------------------------------------------------------

PASSWORD = b"the ledger's password"
WRONG = b"not the password"


@pytest.fixture
def curve_cluster(tmp_path):
    """Three bookies served with CURVE, reached with CURVE (clientutil's transport)."""
    with clusters(tmp_path, CURVE) as make:
        yield make(3)


def test_the_password_is_not_stored_in_the_metadata(curve_cluster):
    bk = curve_cluster.client()
    lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
    manager = bk.ledger_manager
    record, _version = manager.store.get(manager.layout.ledger_path(lh.id))
    assert PASSWORD not in record
    assert BookKeeper.master_key(PASSWORD) not in record  # nor the bookies' key
    assert lh.metadata.check_password(PASSWORD)
    assert not lh.metadata.check_password(WRONG)
    # Salted: the same password makes another hash in another ledger.
    other = bk.create_ledger(3, 2, 2, password=PASSWORD)
    assert other.metadata.password_hash != lh.metadata.password_hash


def test_a_wrong_password_is_refused_at_every_step(curve_cluster):
    bk = curve_cluster.client()
    lh = bk.create_ledger(3, 3, 3, password=PASSWORD)
    lh.add_entry(b"first")
    reader = curve_cluster.client()
    for recovery in (False, True):  # opening to read, and to recover (fence, close)
        with pytest.raises(Unauthorized, match="wrong password"):
            reader.open_ledger(lh.id, password=WRONG, recovery=recovery)
    wrong_key = BookKeeper.master_key(WRONG)
    forged = entry(lh.id, 1, lac=0)
    for bookie_id in lh.metadata.fragments[0].ensemble:
        bookie = curve_cluster.bookie_client(bookie_id)
        with pytest.raises(Unauthorized):  # an add
            bookie.add(lh.id, 1, forged, wrong_key).result(timeout=WAIT_S)
        with pytest.raises(Unauthorized):  # a recovery add
            bookie.add(lh.id, 1, forged, wrong_key, recovery=True).result(timeout=WAIT_S)
        with pytest.raises(Unauthorized):  # a fencing read
            bookie.read(lh.id, 0, fence=True, master_key=wrong_key).result(timeout=WAIT_S)
        with pytest.raises(Unauthorized):  # an explicit LAC
            bookie.write_lac(lh.id, 5, wrong_key).result(timeout=WAIT_S)
    # None of it fenced the ledger or added anything: the writer goes on.
    assert lh.add_entry(b"second") == 1
    entries = reader.open_ledger(lh.id, password=PASSWORD, recovery=True).read_entries(0, 1)
    assert [e.data for e in entries] == [b"first", b"second"]


def test_mac_digests_reveal_entries_altered_or_forged_without_the_password(curve_cluster):
    bk = curve_cluster.client()
    lh = bk.create_ledger(3, 3, 3, password=PASSWORD, digest="MAC")
    lh.add_entry(b"genuine")
    lh.close()
    bookie_id = lh.metadata.fragments[0].ensemble[0]
    stored = curve_cluster.stored_entry(bookie_id, lh.id, 0)
    digests = DigestManager(lh.id, DigestType.MAC, PASSWORD)
    assert digests.decode(0, stored).data == b"genuine"
    altered = stored[:-7] + b"forged!"
    with pytest.raises(DigestMismatch):
        digests.decode(0, altered)
    forged = DigestManager(lh.id, DigestType.MAC, WRONG).encode(0, -1, 7, b"forged!")
    with pytest.raises(DigestMismatch):
        digests.decode(0, forged)
    # Every bookie is given the master key, SHA-1("ledger" + password), with the adds: a
    # MAC keyed with it (as ledgers of metadata format 1 were) is refused too.
    assert lh.metadata.mac_key_prefix == "mac"
    assert BookKeeper.master_key(PASSWORD) == hashlib.sha1(b"ledger" + PASSWORD).digest()
    by_a_bookie = DigestManager(lh.id, DigestType.MAC, PASSWORD, mac_key_prefix="ledger")
    with pytest.raises(DigestMismatch):
        digests.decode(0, by_a_bookie.encode(0, -1, 7, b"forged!"))
    # A reader with the password reads the genuine entry.
    reader = curve_cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.read_entry(0).data == b"genuine"


# -- a secured cluster of bookie processes ------------------------------------------------


def test_keygen_writes_a_key_pair_and_never_overwrites_one(tmp_path):
    said = ok("keygen", str(tmp_path / "keys"), "client1")
    public, secret = tmp_path / "keys" / "client1.key", tmp_path / "keys" / "client1.key_secret"
    assert str(public) in said and str(secret) in said
    keys = load_key_pair(str(secret))
    assert load_key_pair(str(secret)).public in public.read_bytes()
    assert keys.secret not in public.read_bytes()
    assert secret.stat().st_mode & 0o077 == 0, "the secret key is readable by others"
    assert "exists" in failed("keygen", str(tmp_path / "keys"), "client1")


@pytest.mark.processes
def test_a_secured_cluster_of_bookie_processes_serves_only_clients_with_keys(zookeeper,
                                                                            tmp_path):
    with secured_cluster_of_bookies(zookeeper, tmp_path, 3) as secured:
        address, keys, zk_settings, security = secured[:4]
        started = secured.bookies.started
        with connect(address, keys.client(FAST), zk_settings=zk_settings) as bk:
            for bookie in started:  # the key is registered with the endpoint, and pinned
                assert bk.metadata.bookie_endpoint(bookie.bookie_id) == \
                    f"{bookie.endpoint}#curve={keys.bookie_public.decode()}"
            lh = bk.create_ledger(3, 2, 2, password=CLUSTER_PASSWORD)
            for i in range(20):
                lh.add_entry(b"secret %d" % i)
            lh.close()
            reread = bk.open_ledger(lh.id, password=CLUSTER_PASSWORD, recovery=False)
            assert [e.data for e in reread.read_entries(0, 19)] == \
                [b"secret %d" % i for i in range(20)]

        # Without keys (and without ZooKeeper credentials): the metadata reads, nothing
        # else does, and every refusal is prompt and says why.
        with connect(address, PATIENT, zk_settings=zkutil.settings()) as plain:
            handle = plain.open_ledger(lh.id, password=CLUSTER_PASSWORD, recovery=False)
            with pytest.raises(BookKeeperError, match="requires CURVE"):
                handle.read_entry(0)
            with pytest.raises(MetadataError, match="(?i)auth"):
                plain.create_ledger(3, 2, 2, password=CLUSTER_PASSWORD)
        # The admin shell, with the cluster's credentials and a client key: bookieinfo
        # reaches every bookie over CURVE, and a change to the metadata goes through.
        info = json.loads(ok("bookieinfo", "--zk", address, *security, *secured.curve_client,
                             "--json"))
        assert info["unreachable"] == 0 and len(info["bookies"]) == 3, info
        assert "requires CURVE" in json.loads(ok(
            "bookieinfo", "--zk", address, "--json"))["bookies"][0]["error"]
        ok("lostbookierecoverydelay", "--zk", address, *security, "7")
        assert "auth" in failed("lostbookierecoverydelay", "--zk", address, "9").lower()
        # With a key the bookies do not allow.
        with connect(address, keys.client(PATIENT, keys.stranger_secret),
                     zk_settings=zk_settings) as stranger:
            handle = stranger.open_ledger(lh.id, password=CLUSTER_PASSWORD, recovery=False)
            with pytest.raises(BookKeeperError, match="handshake|connection"):
                handle.read_entry(0)


@pytest.mark.processes
def test_bookies_of_a_secured_cluster_re_replicate_to_each_other_over_curve(zookeeper,
                                                                           tmp_path):
    with secured_cluster_of_bookies(
            zookeeper, tmp_path, 4, "--set", f"bookieRecoveryPasswd={CLUSTER_PASSWORD.decode()}",
            zk_timeout_ms=zkutil.SHORT_SESSION_TIMEOUT_MS) as secured, \
            connect(secured.address, secured.keys.client(AUTORECOVERY_FAST),
                    zk_settings=secured.zk_settings) as bk, \
            ZooKeeperMetadataStore(secured.address, secured.zk_settings) as store:
        ledgers = [write_ledger(bk, 3, 2, entries=12) for _ in range(3)]
        victim_id = ledgers[0].metadata.fragments[0].ensemble[0]
        next(p for p in secured.bookies.started if p.bookie_id == victim_id).kill()
        manager = UnderreplicationManager(store)
        wait_until(lambda: repaired(bk, manager, victim_id),
                   f"the ledgers of {victim_id} repaired by the other bookies",
                   timeout_s=120)
        for ledger in ledgers:
            metadata = bk.ledger_manager.read(ledger.id).metadata
            check_replicas(bk, metadata, metadata.last_entry_id)


@pytest.mark.processes
def test_a_bookie_with_unusable_curve_settings_says_why_in_one_line(zookeeper, tmp_path):
    keys = make_keys(str(tmp_path / "keys"))
    address = zkutil.formatted_cluster(zookeeper)
    base = ("bookie", "--zk", address, "--listen", "127.0.0.1:0", "--format",
            "--journal-dir", str(tmp_path / "journal"), "--ledger-dir", str(tmp_path / "l"),
            "--set", "zmqCurveEnabled=true")
    for options, reason in (
            ((f"zmqCurveSecretKeyFile={tmp_path / 'missing'}",
              f"zmqCurveAllowedClientKeysDirectory={keys.allowed}"), "zmqCurveSecretKeyFile"),
            ((f"zmqCurveSecretKeyFile={tmp_path / 'keys' / 'bookie' / 'bookie.key'}",
              f"zmqCurveAllowedClientKeysDirectory={keys.allowed}"), "no secret key"),
            ((f"zmqCurveSecretKeyFile={keys.bookie_secret}",),
             "zmqCurveAllowedClientKeysDirectory")):
        result = pybk(*base, *(arg for option in options for arg in ("--set", option)))
        said = result.stderr
        assert result.returncode == 1 and said.count("\n") == 1, result
        assert said.startswith("pybk bookie: ") and reason in said, said


@pytest.mark.processes
def test_a_wal_promoted_to_a_secured_cluster_replicates_over_curve(zookeeper, tmp_path):
    with secured_cluster_of_bookies(zookeeper, tmp_path, 2) as secured:
        keys, zk = secured.keys, secured.zk_settings
        directory = tmp_path / "wal"
        with pybk_open(directory, cluster=secured.address, ensemble=3, write_quorum=3,
                       ack_quorum=3, listenAddress="127.0.0.1:0", addEntryTimeout=5.0,
                       zmqCurveEnabled=True, zmqCurveSecretKeyFile=keys.bookie_secret,
                       zmqCurveAllowedClientKeysDirectory=keys.allowed,
                       zkEnableSecurity=True, zkDigestAuthFile=zk.zkDigestAuthFile) as wal:
            written = [(wal.append(b"record %d" % i), b"record %d" % i) for i in range(30)]
            ledger_id = wal._writer.metadata.tail[-1].ledger_id
            wal_bookie = wal.bookie_id
            # Every bookie, the WAL's own too (its CURVE server), holds every entry.
            with connect(secured.address, keys.client(FAST), zk_settings=zk) as bk:
                assert "#curve=" in bk.metadata.bookie_endpoint(wal_bookie)
                metadata = bk.ledger_manager.read(ledger_id).metadata
                assert wal_bookie in metadata.fragments[0].ensemble
                for bookie_id in metadata.fragments[0].ensemble:
                    bk.bookie_client(bookie_id).read(ledger_id, 0).result(timeout=WAIT_S)
            assert list(wal.read()) == written


@pytest.mark.processes
def test_the_http_sanity_test_of_a_secured_bookie_uses_its_credentials(zookeeper, tmp_path):
    """``/api/v1/bookie/sanity`` writes a ledger as the bookie: with its ZooKeeper
    credentials (the cluster's ACLs refuse a ledger id to anyone else) and key pair."""
    with secured_cluster_of_bookies(zookeeper, tmp_path, 1, "--set", "httpServerEnabled=true",
                                    "--set", "httpServerPort=0") as secured:
        [bookie] = secured.bookies.started
        url = re.search(r"HTTP admin API at (\S+)", bookie.output).group(1)
        with urllib.request.urlopen(f"{url}/api/v1/bookie/sanity", timeout=30) as answer:
            assert json.loads(answer.read()) == {"passed": True, "readOnly": False}
