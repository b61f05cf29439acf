"""The secret backend: outside PostgreSQL, addressed by immutable version references. Secret bytes never enter
a row, a log or a digest; verification asks only whether a version exists (metadata), never reads bytes."""
from connector.secrets.backend import FileSecretBackend, secret_backend

__all__ = ["FileSecretBackend", "secret_backend"]
