"""ZeroMQ CURVE between clients and bookies: key files, the bookie's side, the client's
side, and the bookie's public key in its registration.

CURVE (ZeroMQ's CurveZMQ: Curve25519 keys, every message encrypted and authenticated)
is pybk's counterpart of BookKeeper's ``tlsEnabled``.  It is off by default, for local
use; every networked deployment should turn it on (``zmqCurveEnabled=true`` for bookies
and clients alike), since without it anyone who reaches a bookie's port reads and writes
its ledgers.

Key files are ZeroMQ's certificate format (:func:`zmq.auth.create_certificates`), text:
``NAME.key`` holds ``public-key = "<40 Z85 characters>"``, ``NAME.key_secret`` holds
the public and the ``secret-key``.  ``pybk keygen DIR NAME`` writes a pair
(:func:`create_key_pair`).  Settings:

* ``zmqCurveSecretKeyFile``: this process's ``.key_secret`` (bookies and clients).
* ``zmqCurveAllowedClientKeysDirectory`` (bookies): the ``*.key`` files of the clients
  the bookie accepts, read when the server starts.  Other bookies are clients too
  (re-replication): put their public keys there as well.

The bookie's side: the server socket is a CURVE server, and a ZAP authenticator thread
(:class:`zmq.auth.thread.ThreadAuthenticator`, on the server's ZeroMQ context) accepts a
handshake only from a client key in the directory.  A client with another key, or
without CURVE, never gets a message through: its handshake fails.

The client's side: a client pins the key the bookie registered (it cannot be tricked
into talking to a process that took the bookie's address: that process lacks the secret
key, so the handshake fails).  The registration's data is then
``tcp://host:port#curve=<Z85 public key>`` (:func:`registered_endpoint`); a ZeroMQ TCP
endpoint never holds ``#``, so the first one splits it (:func:`split_registered`).  A
client with CURVE on refuses a bookie that registered no key, and one with CURVE off a
bookie that did, with BookieUnavailable saying so, instead of a handshake that would
fail over and over.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, NamedTuple

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from pybk.errors import BookieUnavailable, InvalidConfiguration

if TYPE_CHECKING:
    from pybk.settings import ServerSettings

#: Separates the endpoint from the bookie's public key in a registration.
_KEY_MARK = "#curve="
#: Length of a Curve25519 key in Z85 text.
_Z85_KEY_CHARS = 40


class KeyPair(NamedTuple):
    """A CURVE key pair, each key as 40 Z85 characters (bytes)."""

    public: bytes
    secret: bytes


def create_key_pair(directory: str | os.PathLike[str], name: str) -> tuple[str, str]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (both keys, created readable
    by the owner only) into ``directory`` (made if missing), in the format of
    :func:`zmq.auth.create_certificates`; their paths.  Refuses (FileExistsError) to
    overwrite either file: a bookie's key is pinned by its clients."""
    if not name or os.sep in name or name.startswith("."):
        raise InvalidConfiguration(f"key name {name!r} is invalid: it must be a plain "
                                   "file name such as bookie1 or client")
    os.makedirs(directory, exist_ok=True)
    public_path = os.path.join(directory, f"{name}.key")
    secret_path = public_path + "_secret"
    public, secret = zmq.curve_keypair()
    _write_certificate(secret_path, 0o600, public, secret)
    try:
        _write_certificate(public_path, 0o644, public, None)
    except BaseException:
        os.remove(secret_path)
        raise
    return public_path, secret_path


def write_public_key(path: str, public: bytes) -> None:
    """Write a ``.key`` file holding ``public`` (for an allowed client keys directory);
    FileExistsError if there is one."""
    _write_certificate(path, 0o644, public, None)


def _write_certificate(path: str, mode: int, public: bytes, secret: bytes | None) -> None:
    """A ZeroMQ certificate file, created with ``mode`` (never over an existing file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise FileExistsError(f"{path} exists: remove it first to make a new key "
                              "pair") from None
    lines = ["#   ZeroMQ CURVE " + ("**Secret** " if secret else "Public ")
             + "Certificate, written by pybk keygen", "", "metadata", "curve",
             f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())


@functools.lru_cache(maxsize=16)
def load_key_pair(path: str) -> KeyPair:
    """The key pair in a ``.key_secret`` file (cached: one read per process and path).
    InvalidConfiguration naming ``zmqCurveSecretKeyFile`` if it is missing or holds no
    secret key."""
    if not os.path.isfile(path):
        raise InvalidConfiguration(f"setting zmqCurveSecretKeyFile={path!r}: no such file "
                                   "(pybk keygen DIR NAME writes NAME.key_secret)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise InvalidConfiguration(f"setting zmqCurveSecretKeyFile={path!r}: {e}") from None
    if secret is None:
        raise InvalidConfiguration(f"setting zmqCurveSecretKeyFile={path!r}: the file holds "
                                   "no secret key (give the .key_secret file, not the .key)")
    return KeyPair(public, secret)


def serve(context: zmq.Context, socket: zmq.Socket, secret_key_file: str,
          allowed_client_keys_directory: str) -> tuple[ThreadAuthenticator, bytes]:
    """Make ``socket`` (not bound yet) a CURVE server accepting the client keys of the
    directory, with a started authenticator on ``context`` (stop it before terminating
    the context); and the server's public key."""
    keys = load_key_pair(secret_key_file)
    if not os.path.isdir(allowed_client_keys_directory):
        raise InvalidConfiguration(
            f"setting zmqCurveAllowedClientKeysDirectory={allowed_client_keys_directory!r} "
            "is not a directory: a bookie serving CURVE needs one holding the .key files of "
            "the clients to accept")
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    try:
        authenticator.configure_curve(domain="*", location=allowed_client_keys_directory)
        socket.curve_secretkey = keys.secret
        socket.curve_publickey = keys.public
        socket.curve_server = True
    except BaseException:
        authenticator.stop()
        raise
    return authenticator, keys.public


def client_keys(curve_enabled: bool, secret_key_file: str, bookie_id: str,
                server_key: bytes | None) -> KeyPair | None:
    """The key pair a client uses to reach a bookie that registered ``server_key`` (None:
    no CURVE).  BookieUnavailable if one side has CURVE and the other has not."""
    if curve_enabled and server_key is None:
        raise BookieUnavailable(f"bookie {bookie_id} registered no CURVE key (it serves "
                                "without zmqCurveEnabled): refusing to talk to it in clear")
    if not curve_enabled and server_key is not None:
        raise BookieUnavailable(f"bookie {bookie_id} requires CURVE: set zmqCurveEnabled "
                                "and zmqCurveSecretKeyFile to reach it")
    return load_key_pair(secret_key_file) if curve_enabled else None


def client_settings_of(settings: "ServerSettings") -> dict[str, Any]:
    """The CURVE settings of a ClientSettings for a process configured by ``settings``
    (a bookie reaching other bookies, the admin shell): its own key pair."""
    return {"zmqCurveEnabled": settings.zmqCurveEnabled,
            "zmqCurveSecretKeyFile": settings.zmqCurveSecretKeyFile}


def connect_as_client(socket: zmq.Socket, keys: KeyPair, server_key: bytes) -> None:
    """Make ``socket`` (not connected yet) a CURVE client of the server ``server_key``."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_serverkey = server_key


def registered_endpoint(endpoint: str, public_key: bytes | None) -> str:
    """What a bookie registers: its endpoint, and its public key if it serves CURVE."""
    if public_key is None:
        return endpoint
    return f"{endpoint}{_KEY_MARK}{public_key.decode('ascii')}"


def split_registered(data: str) -> tuple[str, bytes | None]:
    """A registration's endpoint and public key (None: no CURVE).  BookieUnavailable if
    the key is not 40 Z85 characters."""
    endpoint, mark, key = data.partition(_KEY_MARK)
    if not mark:
        return endpoint, None
    if len(key) != _Z85_KEY_CHARS:
        raise BookieUnavailable(f"the registration {data!r} holds a malformed CURVE key")
    return endpoint, key.encode("ascii")


__all__ = ["KeyPair", "client_keys", "client_settings_of", "connect_as_client", "create_key_pair",
           "load_key_pair", "registered_endpoint", "serve", "split_registered",
           "write_public_key"]
