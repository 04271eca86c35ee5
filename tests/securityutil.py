"""A secured cluster for tests: ZooKeeper digest credentials, and ``pybk bookie``
processes serving CURVE on a cluster formatted with ZooKeeper ACLs (docs/guide/security.md)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Iterator, NamedTuple

import zkutil
from clusterutil import BookieProcesses, ok
from curveutil import CurveKeys, make_keys

from pybk.meta.zookeeper import ZooKeeperSettings


def zookeeper_credentials(directory: Path, world_readable: bool = True) -> ZooKeeperSettings:
    """The test ZooKeeper settings with digest credentials (a ``zk-auth`` file written in
    ``directory``)."""
    auth = directory / "zk-auth"
    auth.write_text("pybk:s3cret-pw\n")
    return dataclasses.replace(zkutil.settings(), zkEnableSecurity=True,
                               zkDigestAuthFile=str(auth), zkWorldReadable=world_readable)


class SecuredCluster(NamedTuple):
    address: str
    keys: CurveKeys
    zk_settings: ZooKeeperSettings
    #: The ``pybk`` options that give a command the cluster's ZooKeeper credentials.
    security: tuple[str, ...]
    bookies: BookieProcesses

    @property
    def curve_client(self) -> tuple[str, ...]:
        """The ``pybk`` options that give a command the allowed client's key pair."""
        return ("--set", "zmqCurveEnabled=true",
                "--set", f"zmqCurveSecretKeyFile={self.keys.client_secret}")


@contextlib.contextmanager
def secured_cluster_of_bookies(zookeeper, tmp_path: Path, count: int, *options: str,
                               zk_timeout_ms: int = zkutil.SESSION_TIMEOUT_MS
                               ) -> Iterator[SecuredCluster]:
    """A cluster formatted by ``pybk format-cluster`` with ZooKeeper ACLs, and ``count``
    ``pybk bookie`` processes serving CURVE (the same key pair; each allows the others'
    key and the client's), given ``options`` too; killed at the end."""
    keys = make_keys(str(tmp_path / "keys"))
    zk_settings = zookeeper_credentials(tmp_path)
    security = ("--set", "zkEnableSecurity=true",
                "--set", f"zkDigestAuthFile={zk_settings.zkDigestAuthFile}")
    address = zookeeper.address(zkutil.fresh_root())
    ok("format-cluster", "--zk", address, *security)
    group = BookieProcesses(tmp_path, address)
    try:
        group.start_serving(count, zk_timeout_ms=zk_timeout_ms, options=(
            *security, "--set", "zmqCurveEnabled=true",
            "--set", f"zmqCurveSecretKeyFile={keys.bookie_secret}",
            "--set", f"zmqCurveAllowedClientKeysDirectory={keys.allowed}", *options))
        yield SecuredCluster(address, keys, zk_settings, security, group)
    finally:
        group.close()
