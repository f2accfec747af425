"""SSH keys for a pool: made fresh, read from the user's file, written privately."""

from __future__ import annotations

import os
from typing import Any

from skyward._optional import require
from skyward.errors import ConfigError

__all__ = ["new_key_pair", "public_key_of", "write_private"]


def new_key_pair() -> tuple[str, str]:
    """A fresh ed25519 key pair: (private key in OpenSSH PEM, public key line)."""
    s = require("cryptography.hazmat.primitives.serialization", "sky.AWS key pairs", extra="aws")
    ed25519 = require("cryptography.hazmat.primitives.asymmetric.ed25519", "sky.AWS key pairs", extra="aws")

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.OpenSSH, s.NoEncryption()).decode()
    public = key.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).decode()
    return private, public


def public_key_of(path: str) -> str:
    """The public key line for the private key at ``path`` (its ``.pub`` file, else derived)."""
    pub = path + ".pub"
    if os.path.isfile(pub):
        fields = open(pub, encoding="utf-8").read().split()
        if len(fields) >= 2 and fields[0].startswith(("ssh-", "ecdsa-")):
            return f"{fields[0]} {fields[1]}"
    s = require("cryptography.hazmat.primitives.serialization", "sky.AWS key pairs", extra="aws")

    data = open(path, "rb").read()
    key: Any
    try:
        try:
            key = s.load_ssh_private_key(data, password=None)
        except ValueError:
            key = s.load_pem_private_key(data, password=None)
        return str(key.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).decode())
    except (ValueError, TypeError) as exc:
        raise ConfigError("ssh_key", "an unencrypted private key file (or one with a .pub file beside it)",
                          path, detail=str(exc)) from None


def write_private(directory: str, name: str, text: str) -> str:
    """Write ``text`` to ``directory/name`` with mode 0600 from the first byte."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path
