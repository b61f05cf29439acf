"""The secret API other apps use (D-258): store a new immutable version, ask whether a version exists, read its
bytes at use time. The backend (`connector.secrets`, outside PostgreSQL) stays private to the connector app;
secret bytes never enter a row, a log or a digest. None of these opens a transaction: the backend is files."""
from __future__ import annotations

from connector.secrets import secret_backend


def put_secret(identity: str, secret: bytes) -> str:
    """A new write-once version of `identity`'s secret; returns its immutable version reference."""
    return secret_backend().put(identity, secret)


def secret_version_exists(ref: str) -> bool:
    """Whether the version is present (metadata only: the bytes are not read)."""
    return secret_backend().version_exists(ref)


def read_secret(ref: str) -> bytes:
    """The version's bytes, for the egress adapter at the moment of use only."""
    return secret_backend().read(ref)
