from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from connector.errors import OwnerFactInvalid, OwnerUnavailable, SecretBackendError

_REF = re.compile(r"^(?P<identity>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/v(?P<version>[1-9][0-9]{0,8})$")


class FileSecretBackend:
    """Write-once secret versions as files `<root>/<identity>/v<n>` (mode 0600). A version reference, once
    written, always names the same bytes: files are created exclusively and never rewritten."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, ref: str) -> Path:
        match = _REF.match(ref) if isinstance(ref, str) else None
        if match is None:
            raise OwnerFactInvalid(f"secret version reference {ref!r} is not canonical", field="secret_version_ref")
        return self.root / match["identity"] / f"v{match['version']}"

    def _require_root(self) -> None:
        if not self.root.is_dir():
            raise OwnerUnavailable(f"secret backend root {self.root} is not available")

    def put(self, identity: str, secret: bytes) -> str:
        """Store a new immutable version and return its reference."""
        if not _REF.match(f"{identity}/v1"):
            raise SecretBackendError(f"credential identity {identity!r} cannot name a secret")
        directory = self.root / identity
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        version = 1 + max((int(p.name[1:]) for p in directory.glob("v*") if p.name[1:].isdigit()), default=0)
        while True:
            ref = f"{identity}/v{version}"
            try:
                fd = os.open(self._path(ref), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                version += 1
                continue
            with os.fdopen(fd, "wb") as handle:
                handle.write(secret)
                handle.flush()
                os.fsync(handle.fileno())
            return ref

    def version_exists(self, ref: str) -> bool:
        """Metadata only: whether the exact version exists. Never opens the file."""
        path = self._path(ref)
        self._require_root()
        try:
            return path.stat().st_size >= 0
        except FileNotFoundError:
            return False
        except OSError as exc:  # unreadable mount, permission: retryable unavailability
            raise OwnerUnavailable(f"secret backend cannot stat {ref}: {exc.strerror}") from exc

    def versions_present(self, refs: Iterable[str]) -> dict[str, bool]:
        """Metadata only, batched: for each reference this listing can decide, whether the exact version exists,
        with one directory listing per credential identity instead of one stat per version (issue 19: an epoch's
        reread checks two versions per account). References it cannot decide are left out, and the caller asks
        `version_exists` for them, which raises exactly as before: a non-canonical reference, an unavailable
        root or identity directory, and a version that is a symbolic link (existence follows the link).
        Never opens a file."""
        by_identity: dict[str, dict[str, str]] = {}
        for ref in refs:
            match = _REF.match(ref) if isinstance(ref, str) else None
            if match is not None:
                by_identity.setdefault(match["identity"], {})[f"v{match['version']}"] = ref
        if not by_identity or not self.root.is_dir():
            return {}
        present: dict[str, bool] = {}
        for identity, versions in by_identity.items():
            try:
                with os.scandir(self.root / identity) as entries:
                    listed = {entry.name: entry.is_symlink() for entry in entries if entry.name in versions}
            except FileNotFoundError:
                listed = {}
            except OSError:  # unreadable, not a directory: version_exists decides (and raises) per reference
                continue
            for name, ref in versions.items():
                if name not in listed:
                    present[ref] = False
                elif not listed[name]:
                    present[ref] = True
        return present

    def read(self, ref: str) -> bytes:
        """Secret bytes, for the egress adapter at use time only."""
        path = self._path(ref)
        self._require_root()
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise OwnerFactInvalid(f"secret version {ref} is absent") from exc

    def destroy(self, ref: str) -> None:
        """Retention removal of one version (it is then authoritatively absent)."""
        self._path(ref).unlink(missing_ok=True)


def secret_backend() -> FileSecretBackend:
    from django.conf import settings

    return FileSecretBackend(settings.CONNECTOR["SECRET_BACKEND_DIR"])
