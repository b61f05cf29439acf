"""The closed ``ConnectorDigestProfile`` registry (CV2-01-006 .. CV2-01-015, CV2-01-026).

Exactly four digest profiles exist. A profile is selected only by its exact ID
(no trimming, no case folding, never inferred from digest shape); the registry
is a read-only mapping and :class:`DigestProfile` cannot be instantiated outside
this module, so nothing can add a profile at runtime.

=======================  ===========================================  ========  ==========================
Registry entry           Stored profile ID                            Authors?  Reads
=======================  ===========================================  ========  ==========================
``LEGACY_UNPROFILED``    ``None`` (no profile ID stored)              never     stored digest as-is only;
                                                                                cannot recompute/verify
``V1``                   ``nexuscrm.connector-digest-profile.v1``     never     V1 line recipe (validate
                                                                                retained V1 bytes only)
``V2``                   ``nexuscrm.connector-digest-profile.v2``     yes       typed encoding, domain
                                                                                ``"<profile id>/<purpose>"``
``DELIVERY``             ``canonical_typed_length_delimited_v1``      yes       typed encoding, domain
                                                                                ``"<purpose>"``
=======================  ===========================================  ========  ==========================

V2 is the sole ServingEpoch authoring profile (:data:`EPOCH_AUTHORING_PROFILE_ID`).
DELIVERY is the REST bulk delivery contract's encoding (e.g. the
``operation_namespace`` digest). Digests carry their profile in a
:class:`DigestRef` and are never compared across profiles.

The V1 recipe (read-only; documented in ``docs/digest-profiles.md``)::

    sha256( b"nexuscrm.connector-digest-profile.v1\\n"
            + for each (name, value) of the Record, in order:
                utf8(name) + b"=" + rendered(value) + b"\\n" )

    rendered(str)   = utf8(value)             (must not contain "\\n")
    rendered(bytes) = lowercase hex, ASCII
    rendered(int)   = decimal ASCII ("-" for negatives; bool is refused)

Anything else (None, bool, lists, nested records, names containing ``=``) is
``CANONICAL_V1_UNREPRESENTABLE``. The recipe has no type tags, no length
framing and no purpose/domain separation -- which is exactly why it may never
author new digests.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .encoding import ENCODING_ID, CanonicalEncodingError, Record, encode
from .identity import IdentityRejected, canonical_identity

__all__ = [
    "DIGEST_PROFILE_EMPTY",
    "DIGEST_PROFILE_UNKNOWN",
    "DIGEST_PROFILE_READ_ONLY",
    "DIGEST_PROFILE_MISMATCH",
    "V1_PROFILE_ID",
    "V2_PROFILE_ID",
    "DELIVERY_PROFILE_ID",
    "EPOCH_AUTHORING_PROFILE_ID",
    "V1_RECIPE_HEADER",
    "LEGACY_UNPROFILED",
    "V1",
    "V2",
    "DELIVERY",
    "PROFILES",
    "DigestProfile",
    "DigestProfileError",
    "DigestProfileEmpty",
    "DigestProfileUnknown",
    "DigestProfileReadOnly",
    "DigestProfileMismatch",
    "DigestRef",
    "authoring_profile",
    "profile_for",
]

DIGEST_PROFILE_EMPTY = "DIGEST_PROFILE_EMPTY"
DIGEST_PROFILE_UNKNOWN = "DIGEST_PROFILE_UNKNOWN"
DIGEST_PROFILE_READ_ONLY = "DIGEST_PROFILE_READ_ONLY"
DIGEST_PROFILE_MISMATCH = "DIGEST_PROFILE_MISMATCH"

V1_PROFILE_ID = "nexuscrm.connector-digest-profile.v1"
V2_PROFILE_ID = "nexuscrm.connector-digest-profile.v2"
DELIVERY_PROFILE_ID = ENCODING_ID  # "canonical_typed_length_delimited_v1"
EPOCH_AUTHORING_PROFILE_ID = V2_PROFILE_ID

V1_RECIPE_HEADER = b"nexuscrm.connector-digest-profile.v1\n"

# Closed set of recipes a profile can use.
_RECIPE_LEGACY_OPAQUE = "legacy_opaque"
_RECIPE_V1_LINES = "v1_lines"
_RECIPE_TYPED_PROFILE_FRAMED = "typed_profile_framed"
_RECIPE_TYPED_CALLER_DOMAIN = "typed_caller_domain"

_DIGEST_SIZES = {"sha256": 32}

_CONSTRUCTION_TOKEN = object()


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


class DigestProfileError(ValueError):
    """Base class; ``code`` is stable."""

    code = "DIGEST_PROFILE_ERROR"

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{self.code}: {detail}")

    def __reduce__(self):
        return (type(self), (self.detail,))


class DigestProfileEmpty(DigestProfileError):
    """An empty profile ID aliases no profile (CV2-01-013)."""

    code = DIGEST_PROFILE_EMPTY


class DigestProfileUnknown(DigestProfileError):
    """The profile ID is not exactly registered (CV2-01-009)."""

    code = DIGEST_PROFILE_UNKNOWN


class DigestProfileReadOnly(DigestProfileError):
    """The profile may not author (or, for legacy, even recompute) digests."""

    code = DIGEST_PROFILE_READ_ONLY


class DigestProfileMismatch(DigestProfileError):
    """Two digests under different profiles were about to be compared (CV2-01-026)."""

    code = DIGEST_PROFILE_MISMATCH


# ---------------------------------------------------------------------------
# profile
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DigestProfile:
    """One closed ``ConnectorDigestProfile``. Instances exist only in :data:`PROFILES`.

    Attributes:
        profile_id: exact stored ID (``None`` for legacy unprofiled rows).
        label: human label for admin/docs.
        authoring: may author new digests (V2 and DELIVERY only).
        algorithm: digest algorithm (``None`` for legacy: unknown, never computed).
        encoding: preimage recipe name.
        domain_rule: how the domain separator is formed.
        null_representation / text_encoding / binary_encoding / integer_encoding /
        length_framing / normalization: the rest of the closed recipe
        (CV2-01-007), documented for admin and the docs page.
    """

    profile_id: str | None
    label: str
    authoring: bool
    algorithm: str | None
    encoding: str
    domain_rule: str
    null_representation: str
    text_encoding: str
    binary_encoding: str
    integer_encoding: str
    length_framing: str
    normalization: str
    _recipe: str = field(repr=False, compare=False)
    _token: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._token is not _CONSTRUCTION_TOKEN:
            raise TypeError("DigestProfile is a closed registry; use profile_for()")

    # -- capabilities -----------------------------------------------------

    @property
    def recomputable(self) -> bool:
        """Whether a reader can recompute a digest from the fields (not legacy)."""
        return self._recipe != _RECIPE_LEGACY_OPAQUE

    @property
    def digest_size(self) -> int | None:
        return _DIGEST_SIZES.get(self.algorithm) if self.algorithm else None

    def _describe(self) -> str:
        return self.profile_id if self.profile_id is not None else "legacy unprofiled"

    def _require_authoring(self, action: str) -> None:
        if not self.authoring:
            raise DigestProfileReadOnly(f"profile {self._describe()!r} is read-only and cannot {action}")

    def _require_recomputable(self, action: str) -> None:
        if not self.recomputable:
            raise DigestProfileReadOnly(
                f"profile {self._describe()!r} has no recipe: its stored digest can only be read as-is, not {action}"
            )

    # -- recipe -----------------------------------------------------------

    def domain(self, purpose: str) -> str:
        """Domain separator for ``purpose`` (typed-encoding profiles only)."""
        if self._recipe not in (_RECIPE_TYPED_PROFILE_FRAMED, _RECIPE_TYPED_CALLER_DOMAIN):
            raise DigestProfileReadOnly(f"profile {self._describe()!r} has no typed domain separator")
        purpose = _check_purpose(purpose)
        if self._recipe == _RECIPE_TYPED_PROFILE_FRAMED:
            return f"{self.profile_id}/{purpose}"
        return purpose

    def _preimage(self, purpose: str | None, value: Any) -> bytes:
        if self._recipe == _RECIPE_V1_LINES:
            if purpose is not None:
                raise TypeError("the V1 recipe has no purpose/domain separation; pass purpose=None")
            return _v1_preimage(value)
        return encode(self.domain(purpose), value)  # type: ignore[arg-type]

    def _hash(self, preimage: bytes) -> bytes:
        return hashlib.new(self.algorithm, preimage).digest()  # type: ignore[arg-type]

    # -- authoring (V2, DELIVERY) -------------------------------------------

    def preimage(self, purpose: str, value: Any) -> bytes:
        """Authoring preimage bytes; read-only profiles raise ``DIGEST_PROFILE_READ_ONLY``."""
        self._require_authoring("author a preimage")
        return self._preimage(purpose, value)

    def digest(self, purpose: str, value: Any) -> bytes:
        """Author a raw digest; read-only profiles raise ``DIGEST_PROFILE_READ_ONLY``."""
        self._require_authoring("author a digest")
        return self._hash(self._preimage(purpose, value))

    def author(self, purpose: str, value: Any) -> "DigestRef":
        """Author a digest paired with this exact profile ID (CV2-01-006)."""
        return DigestRef(self.profile_id, self.digest(purpose, value))

    # -- reading (every profile to the extent it can) ------------------------

    def read(self, stored_digest: bytes | bytearray | memoryview) -> "DigestRef":
        """Exact reader: pair stored bytes with this profile, copied as-is, never recomputed."""
        return DigestRef(self.profile_id, stored_digest)

    def reader_preimage(self, purpose: str | None, value: Any) -> bytes:
        """Recompute preimage bytes for reading/validating retained facts (V1, V2, DELIVERY).

        For V1 ``purpose`` must be ``None``. Legacy raises ``DIGEST_PROFILE_READ_ONLY``.
        """
        self._require_recomputable("recomputed")
        return self._preimage(purpose, value)

    def recompute(self, purpose: str | None, value: Any) -> bytes:
        """Recompute a retained digest with this profile's own recipe (never another's)."""
        self._require_recomputable("recomputed")
        return self._hash(self._preimage(purpose, value))

    def verify(self, purpose: str | None, value: Any, stored: "DigestRef | bytes") -> bool:
        """Recompute and compare in constant time against a stored digest.

        ``stored`` may be raw bytes (read under this profile) or a
        :class:`DigestRef`, which must carry this exact profile
        (``DIGEST_PROFILE_MISMATCH`` otherwise). Legacy unprofiled digests can
        never be verified (``DIGEST_PROFILE_READ_ONLY``).
        """
        self._require_recomputable("verified")
        ref = stored if isinstance(stored, DigestRef) else self.read(stored)
        computed = DigestRef(self.profile_id, self.recompute(purpose, value))
        return computed.same_as(ref)


def _check_purpose(purpose: object) -> str:
    if type(purpose) is not str:
        raise TypeError(f"purpose must be str, got {type(purpose).__name__}")
    try:
        return canonical_identity(purpose, field="purpose", max_length=1024)
    except IdentityRejected as exc:
        code = "CANONICAL_DOMAIN_EMPTY" if exc.code == "IDENTITY_EMPTY" else "CANONICAL_DOMAIN_INVALID"
        raise CanonicalEncodingError(code, f"purpose is not canonical text ({exc.code}: {exc.detail})") from exc


def _v1_preimage(value: Any) -> bytes:
    if not isinstance(value, Record):
        raise CanonicalEncodingError("CANONICAL_V1_UNREPRESENTABLE", "the V1 recipe digests a Record of fields")
    out = bytearray(V1_RECIPE_HEADER)
    for name, item in value:
        if "=" in name:
            raise CanonicalEncodingError("CANONICAL_V1_UNREPRESENTABLE", f"V1 field name {name!r} contains '='")
        if type(item) is str:
            if "\n" in item:
                raise CanonicalEncodingError("CANONICAL_V1_UNREPRESENTABLE", f"V1 text field {name!r} contains a newline")
            rendered = item.encode("utf-8")
        elif type(item) is bytes:
            rendered = item.hex().encode("ascii")
        elif type(item) is int:
            rendered = str(item).encode("ascii")
        else:
            raise CanonicalEncodingError(
                "CANONICAL_V1_UNREPRESENTABLE", f"V1 field {name!r} has type {type(item).__name__}; only str, bytes, int"
            )
        out += name.encode("utf-8") + b"=" + rendered + b"\n"
    return bytes(out)


# ---------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------

_TYPED = dict(
    encoding=ENCODING_ID,
    null_representation="0x00 tag",
    text_encoding="0x01 u32(byte length) strict UTF-8 (lone surrogates rejected)",
    binary_encoding="0x02 u32(byte length) raw bytes (defensively copied)",
    integer_encoding="0x03 signed 64-bit big-endian; counts/lengths u32 big-endian",
    length_framing="u32 big-endian byte length / item count before every variable item",
    normalization="none: text is encoded exactly as given; identities are validated, never normalized",
)

LEGACY_UNPROFILED = DigestProfile(
    profile_id=None,
    label="Legacy unprofiled (read as-is only)",
    authoring=False,
    algorithm=None,
    encoding="unknown (no stored profile)",
    domain_rule="unknown",
    null_representation="unknown",
    text_encoding="unknown",
    binary_encoding="unknown",
    integer_encoding="unknown",
    length_framing="unknown",
    normalization="unknown",
    _recipe=_RECIPE_LEGACY_OPAQUE,
    _token=_CONSTRUCTION_TOKEN,
)

V1 = DigestProfile(
    profile_id=V1_PROFILE_ID,
    label="Connector digest profile V1 (read-only)",
    authoring=False,
    algorithm="sha256",
    encoding="nexuscrm.v1-line-recipe",
    domain_rule='fixed header b"nexuscrm.connector-digest-profile.v1\\n"; no purpose',
    null_representation="unrepresentable (rejected)",
    text_encoding='utf8(name) "=" utf8(value) "\\n" (no framing; newline rejected)',
    binary_encoding="lowercase hex ASCII",
    integer_encoding="decimal ASCII",
    length_framing="none (newline-terminated lines)",
    normalization="none",
    _recipe=_RECIPE_V1_LINES,
    _token=_CONSTRUCTION_TOKEN,
)

V2 = DigestProfile(
    profile_id=V2_PROFILE_ID,
    label="Connector digest profile V2 (ServingEpoch authoring)",
    authoring=True,
    algorithm="sha256",
    domain_rule='"nexuscrm.connector-digest-profile.v2/" + purpose',
    _recipe=_RECIPE_TYPED_PROFILE_FRAMED,
    _token=_CONSTRUCTION_TOKEN,
    **_TYPED,
)

DELIVERY = DigestProfile(
    profile_id=DELIVERY_PROFILE_ID,
    label="REST bulk delivery canonical encoding",
    authoring=True,
    algorithm="sha256",
    domain_rule="purpose (e.g. \"operation_namespace\")",
    _recipe=_RECIPE_TYPED_CALLER_DOMAIN,
    _token=_CONSTRUCTION_TOKEN,
    **_TYPED,
)

#: The closed registry, keyed by exact stored profile ID (``None`` = legacy).
PROFILES: Mapping[str | None, DigestProfile] = MappingProxyType(
    {
        None: LEGACY_UNPROFILED,
        V1_PROFILE_ID: V1,
        V2_PROFILE_ID: V2,
        DELIVERY_PROFILE_ID: DELIVERY,
    }
)

del _TYPED


def profile_for(profile_id: str | None) -> DigestProfile:
    """Exact lookup. ``None`` -> legacy; ``""`` -> empty; anything else unregistered -> unknown."""
    if profile_id is None:
        return LEGACY_UNPROFILED
    if type(profile_id) is not str:
        raise DigestProfileUnknown(f"profile ID must be str or None, got {type(profile_id).__name__}")
    if profile_id == "":
        raise DigestProfileEmpty("an empty profile ID aliases no profile")
    try:
        return PROFILES[profile_id]
    except KeyError:
        raise DigestProfileUnknown(f"profile ID {profile_id!r} is not registered") from None


def authoring_profile(profile_id: str | None) -> DigestProfile:
    """Exact lookup that additionally refuses read-only profiles (legacy, V1)."""
    profile = profile_for(profile_id)
    profile._require_authoring("author new digests")
    return profile


# ---------------------------------------------------------------------------
# digest reference
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DigestRef:
    """A stored digest paired with its exact profile ID.

    Construction validates the profile ID (exact lookup) and copies the digest
    bytes. For profiles with a known algorithm the length must match (32 bytes
    for sha256); legacy digests are kept as-is. ``==`` is :meth:`same_as`:
    comparing refs of different profiles raises ``DIGEST_PROFILE_MISMATCH``
    instead of quietly returning ``False``, and same-profile bytes are compared
    in constant time. There is no way to relabel a ref under another profile.
    """

    profile_id: str | None
    digest: bytes

    def __post_init__(self) -> None:
        profile = profile_for(self.profile_id)
        raw = self.digest
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise TypeError(f"digest must be bytes, got {type(raw).__name__}")
        raw = raw.tobytes() if isinstance(raw, memoryview) else bytes(raw)
        size = profile.digest_size
        if size is not None and len(raw) != size:
            raise CanonicalEncodingError(
                "CANONICAL_DIGEST_LENGTH",
                f"{profile._describe()} digests are {size} bytes, got {len(raw)}",
            )
        object.__setattr__(self, "digest", raw)

    @property
    def profile(self) -> DigestProfile:
        return profile_for(self.profile_id)

    def same_as(self, other: "DigestRef") -> bool:
        if not isinstance(other, DigestRef):
            raise TypeError("same_as() compares two DigestRefs")
        if self.profile_id != other.profile_id:
            raise DigestProfileMismatch(
                f"refusing to compare a {self.profile._describe()!r} digest with a {other.profile._describe()!r} digest"
            )
        return hmac.compare_digest(self.digest, other.digest)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DigestRef):
            return NotImplemented
        return self.same_as(other)

    def __hash__(self) -> int:
        return hash((self.profile_id, self.digest))

    def hex(self) -> str:
        return self.digest.hex()

    def __repr__(self) -> str:
        return f"DigestRef(profile_id={self.profile_id!r}, digest=bytes.fromhex({self.digest.hex()!r}))"
