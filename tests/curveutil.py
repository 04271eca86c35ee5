"""CURVE key sets for tests: a bookie's pair, an allowed client's pair and a stranger's
pair (a key the bookie does not allow), written by :func:`pybk.net.curve.create_key_pair`
as ``pybk keygen`` writes them."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from pybk.net.curve import create_key_pair, load_key_pair
from pybk.settings import ClientSettings


@dataclass(frozen=True)
class CurveKeys:
    directory: str
    bookie_secret: str
    client_secret: str
    stranger_secret: str
    allowed: str

    @property
    def bookie_public(self) -> bytes:
        return load_key_pair(self.bookie_secret).public

    def server(self) -> dict[str, object]:
        """ServerSettings overrides: CURVE on with the bookie's pair."""
        return dict(zmqCurveEnabled=True, zmqCurveSecretKeyFile=self.bookie_secret,
                    zmqCurveAllowedClientKeysDirectory=self.allowed)

    def client(self, settings: ClientSettings, secret: str | None = None) -> ClientSettings:
        """``settings`` with CURVE on, as the allowed client (or with ``secret``)."""
        return settings.replace(zmqCurveEnabled=True,
                                zmqCurveSecretKeyFile=secret or self.client_secret)


def make_keys(directory: str) -> CurveKeys:
    """Write the key set under ``directory``: ``allowed/`` holds the client's and the
    bookie's public keys (bookies reach each other as clients)."""
    allowed = os.path.join(directory, "allowed")
    os.makedirs(allowed)
    secrets = {}
    for name in ("bookie", "client", "stranger"):
        public, secrets[name] = create_key_pair(os.path.join(directory, name), name)
        if name != "stranger":
            shutil.copy(public, allowed)
    return CurveKeys(directory, secrets["bookie"], secrets["client"], secrets["stranger"],
                     allowed)

