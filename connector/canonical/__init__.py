"""Canonical identity and digest kernel for Connector V2.

Pure Python (no Django imports): every app validates identities and authors or
reads digests through this package. See ``docs/digest-profiles.md``.

* :mod:`.encoding`  -- ``canonical_typed_length_delimited_v1`` encode/digest.
* :mod:`.decoding`  -- its strict decoder.
* :mod:`.shapes`    -- fixed-shape records framed straight to its bytes (D-272).
* :mod:`.identity`  -- identity validation before persistence (reject, never repair).
* :mod:`.profiles`  -- the closed ``ConnectorDigestProfile`` registry and ``DigestRef``.
"""

from .decoding import decode
from .encoding import (
    ENCODING_ID,
    I64_MAX,
    I64_MIN,
    MAX_DEPTH,
    U32_MAX,
    CanonicalEncodingError,
    Record,
    canonical_value,
    digest,
    encode,
    i64,
    u32,
)
from .identity import (
    DEFAULT_IDENTITY_MAX_LENGTH,
    IDENTITY_CODES,
    IDENTITY_CONTROL_CHAR,
    IDENTITY_EMPTY,
    IDENTITY_ENCODING,
    IDENTITY_NOT_NFC,
    IDENTITY_NULL,
    IDENTITY_TOO_LONG,
    IDENTITY_TYPE,
    IDENTITY_WHITESPACE,
    IdentityRejected,
    canonical_identity,
    canonical_optional_identity,
)
from .profiles import (
    DELIVERY,
    DELIVERY_PROFILE_ID,
    DIGEST_PROFILE_EMPTY,
    DIGEST_PROFILE_MISMATCH,
    DIGEST_PROFILE_READ_ONLY,
    DIGEST_PROFILE_UNKNOWN,
    EPOCH_AUTHORING_PROFILE_ID,
    LEGACY_UNPROFILED,
    PROFILES,
    V1,
    V1_PROFILE_ID,
    V2,
    V2_PROFILE_ID,
    DigestProfile,
    DigestProfileEmpty,
    DigestProfileError,
    DigestProfileMismatch,
    DigestProfileReadOnly,
    DigestProfileUnknown,
    DigestRef,
    authoring_profile,
    profile_for,
)

__all__ = [
    # encoding
    "ENCODING_ID",
    "I64_MAX",
    "I64_MIN",
    "MAX_DEPTH",
    "U32_MAX",
    "CanonicalEncodingError",
    "Record",
    "canonical_value",
    "decode",
    "digest",
    "encode",
    "i64",
    "u32",
    # identity
    "DEFAULT_IDENTITY_MAX_LENGTH",
    "IDENTITY_CODES",
    "IDENTITY_CONTROL_CHAR",
    "IDENTITY_EMPTY",
    "IDENTITY_ENCODING",
    "IDENTITY_NOT_NFC",
    "IDENTITY_NULL",
    "IDENTITY_TOO_LONG",
    "IDENTITY_TYPE",
    "IDENTITY_WHITESPACE",
    "IdentityRejected",
    "canonical_identity",
    "canonical_optional_identity",
    # profiles
    "DELIVERY",
    "DELIVERY_PROFILE_ID",
    "DIGEST_PROFILE_EMPTY",
    "DIGEST_PROFILE_MISMATCH",
    "DIGEST_PROFILE_READ_ONLY",
    "DIGEST_PROFILE_UNKNOWN",
    "EPOCH_AUTHORING_PROFILE_ID",
    "LEGACY_UNPROFILED",
    "PROFILES",
    "V1",
    "V1_PROFILE_ID",
    "V2",
    "V2_PROFILE_ID",
    "DigestProfile",
    "DigestProfileEmpty",
    "DigestProfileError",
    "DigestProfileMismatch",
    "DigestProfileReadOnly",
    "DigestProfileUnknown",
    "DigestRef",
    "authoring_profile",
    "profile_for",
]
