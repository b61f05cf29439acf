"""Serializers shared by several API views: the error body, an exact epoch reference, hex digests. Each view keeps
its own nested InputSerializer/OutputSerializer (STYLE R14); nothing here saves anything."""
from __future__ import annotations

import re

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from connector.api.exceptions import API_ERROR_CODES

_HEX_DIGEST = re.compile(r"^[0-9a-fA-F]{64}$")


@extend_schema_field({"type": "string", "pattern": "^[0-9a-fA-F]{64}$",
                      "description": "A SHA-256 digest as 64 hexadecimal characters."})
class HexDigestField(serializers.Field):
    """A 32-byte digest as 64 hex characters (either case, nothing else: no spaces, no prefix)."""

    default_error_messages = {"invalid": "Expected a SHA-256 digest as 64 hexadecimal characters."}

    def to_internal_value(self, data: object) -> bytes:
        if not isinstance(data, str) or not _HEX_DIGEST.match(data):
            self.fail("invalid")
        return bytes.fromhex(data)

    def to_representation(self, value: bytes | memoryview) -> str:
        return bytes(value).hex()


class ExactTextField(serializers.CharField):
    """Text passed to the services exactly as sent: never trimmed (the services validate canonical identity and
    refuse padding instead of repairing it, CV2-01-004)."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)


@extend_schema_serializer(component_name="Error")
class ErrorSerializer(serializers.Serializer):
    """Every error body (docs/api.md, "Error catalog")."""

    code = serializers.ChoiceField(choices=sorted(API_ERROR_CODES))
    detail = serializers.JSONField(help_text="A message, or per-field errors for REQUEST_INVALID.")


@extend_schema_serializer(component_name="EpochRef")
class EpochRefSerializer(serializers.Serializer):
    """An exact ServingEpoch reference: ID plus digest."""

    id = ExactTextField()
    digest = HexDigestField()
