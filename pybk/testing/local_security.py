"""The credentials of a secured :class:`~pybk.testing.local_cluster.LocalCluster` (``pybk
localcluster --curve --zk-auth``): made in the cluster's directory unless the settings
name them, and a settings file for its clients.

``curve`` (or ``zmqCurveEnabled=true`` in the settings) serves every bookie with ZeroMQ
CURVE; ``zk_auth`` (or ``zkEnableSecurity=true``) formats the cluster with ZooKeeper
digest ACLs and gives every bookie the credentials.  What the settings do not name is
made, in the cluster's directory::

    keys/bookie.key_secret   the bookies' key pair (zmqCurveSecretKeyFile), mode 0600
    keys/client.key_secret   a client's key pair, mode 0600
    keys/allowed/            the public keys the bookies accept, bookie.key and client.key
                             (zmqCurveAllowedClientKeysDirectory; bookies are clients of
                             each other)
    zk-auth                  pybk:<random password> (zkDigestAuthFile), mode 0600
    client.conf              the settings of a client: metadataServiceUri and the
                             credentials above, for ``pybk simpletest --conf``, the admin
                             shell's ``--conf``, ``pybk.net.connect``

Files already there (a ``--dir`` used before) are used again, so that clients keep
their keys.  With a key pair named by the settings and no allowed directory made here,
the client's key pair is the bookies' own (which they accept, as each other's).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import Mapping

from pybk.net.curve import create_key_pair, load_key_pair, write_public_key
from pybk.settings import ServerSettings

#: The client settings file a secured local cluster writes.
CLIENT_CONF = "client.conf"
#: The user of a ZooKeeper credentials file made here.
ZOOKEEPER_USER = "pybk"


@dataclass(frozen=True)
class LocalCredentials:
    """``server``: ServerSettings for every bookie and the cluster's own ZooKeeper
    clients (as text, for ``pybk bookie --set``); ``client``: a client's settings."""

    server: Mapping[str, str]
    client: Mapping[str, str]


def credentials(directory: str, settings: ServerSettings, curve: bool,
                zk_auth: bool) -> LocalCredentials:
    """The credentials of a cluster in ``directory`` configured by ``settings``, made
    there where ``settings`` name none (see the module docstring)."""
    server: dict[str, str] = {}
    client: dict[str, str] = {}
    if curve or settings.zmqCurveEnabled:
        keys = os.path.join(directory, "keys")
        secret = settings.zmqCurveSecretKeyFile or _key_pair(keys, "bookie")
        allowed = settings.zmqCurveAllowedClientKeysDirectory
        client_secret = secret
        if not allowed:
            allowed = os.path.join(keys, "allowed")
            client_secret = _key_pair(keys, "client")
            os.makedirs(allowed, exist_ok=True)
            for name, pair in (("bookie", secret), ("client", client_secret)):
                public = os.path.join(allowed, f"{name}.key")
                if not os.path.exists(public):
                    write_public_key(public, load_key_pair(pair).public)
        server.update(zmqCurveEnabled="true", zmqCurveSecretKeyFile=secret,
                      zmqCurveAllowedClientKeysDirectory=allowed)
        client.update(zmqCurveEnabled="true", zmqCurveSecretKeyFile=client_secret)
    if zk_auth or settings.zkEnableSecurity:
        auth_file = settings.zkDigestAuthFile or _zookeeper_credentials(directory)
        zookeeper = dict(zkEnableSecurity="true", zkDigestAuthFile=auth_file,
                         zkWorldReadable=str(settings.zkWorldReadable).lower())
        server.update(zookeeper)
        client.update(zookeeper)
    return LocalCredentials(server, client)


def write_client_conf(directory: str, address: str, client: Mapping[str, str]) -> str:
    """Write ``client.conf`` (the cluster's address and ``client``) into ``directory``;
    its path."""
    path = os.path.join(directory, CLIENT_CONF)
    lines = ["# A client of the local cluster: pybk simpletest --conf " + path,
             f"metadataServiceUri={address}", *(f"{k}={v}" for k, v in client.items())]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _key_pair(directory: str, name: str) -> str:
    """The ``.key_secret`` of ``directory/name``, made if missing."""
    secret = os.path.join(directory, name, f"{name}.key_secret")
    if not os.path.exists(secret):
        create_key_pair(os.path.dirname(secret), name)
    return secret


def _zookeeper_credentials(directory: str) -> str:
    """``directory/zk-auth``, holding ``pybk:<random password>``, made if missing."""
    path = os.path.join(directory, "zk-auth")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(f"{ZOOKEEPER_USER}:{secrets.token_urlsafe(24)}\n")
    return path


__all__ = ["CLIENT_CONF", "LocalCredentials", "credentials", "write_client_conf"]
