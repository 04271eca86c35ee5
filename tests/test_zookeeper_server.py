"""Throwaway ZooKeeper servers (pybk.testing.zookeeper_server): clear errors when Java or
ZooKeeper is missing or the server cannot start, and a three-server ensemble."""

from __future__ import annotations

import os

import pytest
import zkutil

from pybk.errors import ZooKeeperServerError
from pybk.meta.zookeeper import ZooKeeperMetadataStore, format_cluster
from pybk.testing import zookeeper_server
from pybk.testing.zookeeper_server import ZooKeeperEnsemble, ZooKeeperServer, four_letter_word

pytestmark = pytest.mark.timeout(120)


def test_missing_java_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ZooKeeperServerError, match="no Java runtime found"):
        zookeeper_server.find_java()


def test_missing_jars_are_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv(zookeeper_server.CLASSPATH_ENV, raising=False)
    monkeypatch.setattr(zookeeper_server.importlib.util, "find_spec", lambda _name: None)
    monkeypatch.setattr(zookeeper_server, "DEBIAN_JAR", str(tmp_path / "none.jar"))
    with pytest.raises(ZooKeeperServerError, match="pip install pyspark"):
        zookeeper_server.find_classpath()


@pytest.mark.java
def test_a_server_that_cannot_start_reports_its_log(monkeypatch):
    monkeypatch.setenv(zookeeper_server.CLASSPATH_ENV, "/nonexistent")
    server = ZooKeeperServer(start_timeout_s=30)
    with pytest.raises(ZooKeeperServerError,
                       match="(?s)exited with status .*its log ends.*ZooKeeperServerMain"):
        with server:
            pass
    assert not server.running
    assert not os.path.exists(server.directory)  # a temporary directory is removed


def test_the_session_server_answers_four_letter_words(zookeeper):
    assert four_letter_word(zookeeper.port, "ruok") == "imok"
    assert "Mode: standalone" in four_letter_word(zookeeper.port, "srvr")


@pytest.mark.zookeeper
def test_a_three_server_ensemble_serves_through_the_loss_of_one(tmp_path):
    with ZooKeeperEnsemble(3, tmp_path / "ensemble", force_sync=False,
                           tick_time_ms=zkutil.TICK_MS) as ensemble:
        modes = sorted(four_letter_word(s.port, "srvr").split("Mode: ")[1].split()[0]
                       for s in ensemble.servers)
        assert modes == ["follower", "follower", "leader"]
        address = ensemble.address(zkutil.fresh_root())
        format_cluster(address, settings=zkutil.settings())
        with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
            store.create("/r", b"before")
            ensemble.servers[0].shutdown(graceful=False)
            assert store.set("/r", b"after", 0) == 1
            assert store.get("/r") == (b"after", 1)
    assert not any(server.running for server in ensemble.servers)


@pytest.mark.zookeeper
def test_a_server_in_a_relative_directory_starts(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with ZooKeeperServer("zk", force_sync=False) as server:
        assert server.directory == str(tmp_path / "zk")
        assert four_letter_word(server.port, "ruok") == "imok"
