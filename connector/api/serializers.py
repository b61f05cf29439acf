"""Serializers shared by several API views: the error body, an exact epoch reference, hex digests. Each view keeps
its own nested InputSerializer/OutputSerializer (STYLE R14); nothing here saves anything."""
from __future__ import annotations

import base64
import binascii
import re

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from connector.api.exceptions import API_ERROR_CODE_CHOICES

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

    default_error_messages = {"invalid": "Expected a JSON string."}

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str):  # never coerce a number into an identity
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_serializer(component_name="Error")
class ErrorSerializer(serializers.Serializer):
    """Every error body (docs/api.md, "Error catalog")."""

    code = serializers.ChoiceField(choices=API_ERROR_CODE_CHOICES)
    detail = serializers.JSONField(help_text="A message, or per-field errors for REQUEST_INVALID.")


@extend_schema_serializer(component_name="EpochRef")
class EpochRefSerializer(serializers.Serializer):
    """An exact ServingEpoch reference: ID plus digest."""

    id = ExactTextField()
    digest = HexDigestField()


@extend_schema_serializer(component_name="ReplayPredecessor")
class ReplayPredecessorSerializer(serializers.Serializer):
    """The V2 Event a replay re-materializes and the digest of the exact component bytes that produced it."""

    event_id = serializers.IntegerField(min_value=1, max_value=2**63 - 1, help_text="The V2 Event to replay.")
    payload_digest = HexDigestField(help_text="SHA-256 of the exact component bytes that produced the Event.")


@extend_schema_field({"type": "string", "format": "byte",
                      "description": "Bytes as standard base64 (RFC 4648, padded, no line breaks)."})
class Base64BytesField(serializers.Field):
    """Exact bytes as strict base64: anything but the standard alphabet with its padding is refused."""

    default_error_messages = {"invalid": "Expected bytes as standard base64."}

    def to_internal_value(self, data: object) -> bytes:
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            return base64.b64decode(data.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            self.fail("invalid")

    def to_representation(self, value: bytes | memoryview) -> str:
        return base64.b64encode(bytes(value)).decode("ascii")


@extend_schema_serializer(component_name="V1PredecessorRef")
class V1PredecessorRefSerializer(serializers.Serializer):
    """The typed V1 predecessor ref (decision D-331): read-only evidence of one V1-accepted item, bound to its V1
    acceptance tombstone. Its original epoch is evidence only; the replay runs under the target V2 epoch."""

    protocol_version = ExactTextField(allow_blank=True,
                                      help_text="Must be `nexuscrm.connector.v1-predecessor-ref.v1`.")
    receipt_channel = ExactTextField(allow_blank=True, help_text="The V1 Receipt: the channel V1 accepted it on.")
    receipt_transport_key = ExactTextField(allow_blank=True, help_text="The V1 Receipt: its transport key.")
    event_id = ExactTextField(allow_blank=True, help_text="The V1 Event identity, `v1:event:<n>`.")
    work_item_id = ExactTextField(allow_blank=True, help_text="The V1 WorkItem identity, `v1:workitem:<n>` (the "
                                                              "tombstone's predecessor ref).")
    original_epoch = ExactTextField(allow_blank=True, help_text="The V1 epoch it was accepted under, "
                                                                "`v1:release:<id>` or `v1:generation:<id>`.")
    payload_digest = HexDigestField(help_text="SHA-256 of the V1 item bytes, as the tombstone authorized it.")
    result_digest = HexDigestField(help_text="SHA-256 of the V1 result evidence of that item.")


@extend_schema_serializer(component_name="V1PredecessorInput")
class V1PredecessorInputSerializer(V1PredecessorRefSerializer):
    """The ref plus the exact V1 item bytes (a tombstone keeps none); they must hash to `payload_digest`."""

    payload = Base64BytesField(help_text="The exact V1 item bytes, base64.")


@extend_schema_serializer(component_name="ReplayExecution")
class ReplayExecutionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    generation = serializers.IntegerField()
    state = serializers.CharField()
    outcome = serializers.CharField(allow_null=True)
    suppress_external_effects = serializers.BooleanField()


@extend_schema_serializer(component_name="ReplayedEvent")
class ReplayedEventSerializer(serializers.Serializer):
    """What became of one replayed event (D-194): `superseded` (at or below the lane high-water, Runtime not
    called), `execution` (an execution of the replay's generation, external effects suppressed), `waiting` (the
    partition is halted, an execution is active, or a strict lane waits for an earlier position) or
    `materialization_pending` (the sweeper finishes it)."""

    event = serializers.IntegerField(allow_null=True)
    partition = serializers.CharField(allow_null=True)
    position = serializers.CharField(allow_null=True)
    disposition = serializers.ChoiceField(choices=["materialization_pending", "superseded", "execution", "waiting"])
    detail = serializers.CharField()
    high_water = serializers.CharField(allow_null=True)
    execution = ReplayExecutionSerializer(allow_null=True)


# -- read models (items of the read endpoints' OutputSerializers) --------------------------------------------------

@extend_schema_serializer(component_name="ReceiptComponent")
class ReceiptComponentSerializer(serializers.Serializer):
    ordinal = serializers.IntegerField()
    disposition = serializers.CharField(help_text="event | duplicate_event | quarantined")
    reason_code = serializers.CharField(help_text="Why a component was quarantined (e.g. EVENT_KEY_CONFLICT).")
    event = serializers.IntegerField(allow_null=True, source="event_id")
    payload_digest = HexDigestField()


@extend_schema_serializer(component_name="ExecutionSummary")
class ExecutionSummarySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    generation = serializers.IntegerField()
    state = serializers.CharField(help_text="ready | waiting_dependency | completed | quarantined")
    attempt_count = serializers.IntegerField()
    result_outcome = serializers.CharField(help_text="applied | noop | rejected | failed, or empty.")
    command_id = serializers.CharField()
    quarantine_reason = serializers.CharField()


@extend_schema_serializer(component_name="SupersededDecisionSummary")
class SupersededDecisionSerializer(serializers.Serializer):
    reason = serializers.CharField(help_text="at_or_below_high_water | lower_than_selected | ...")
    position = serializers.DecimalField(max_digits=38, decimal_places=0)
    high_water_at_decision = serializers.DecimalField(max_digits=38, decimal_places=0, allow_null=True)
    selected_position = serializers.DecimalField(max_digits=38, decimal_places=0, allow_null=True)
    decided_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="ReceiptEvent")
class ReceiptEventSerializer(serializers.Serializer):
    """One Event a component produced or linked, with what became of it (built by ReceiptEventListApi)."""

    id = serializers.IntegerField()
    component_ordinal = serializers.IntegerField()
    component_disposition = serializers.CharField(help_text="event | duplicate_event")
    source_event_key = serializers.CharField()
    kind = serializers.CharField(source="event_kind")
    source_locator = serializers.CharField()
    occurred_at = serializers.CharField()
    route = serializers.CharField()
    epoch = serializers.CharField(source="epoch.epoch_id", help_text="The epoch that admitted the Event.")
    partition = serializers.CharField()
    position = serializers.DecimalField(max_digits=38, decimal_places=0, allow_null=True)
    payload_digest = HexDigestField()
    replay_request = serializers.CharField(allow_null=True, help_text="ReplayRequest ID of a replay generation.")
    predecessor = serializers.IntegerField(allow_null=True, help_text="The replayed Event, for a replay generation.")
    projection = serializers.IntegerField(allow_null=True)
    window = serializers.IntegerField(allow_null=True)
    superseded = SupersededDecisionSerializer(allow_null=True)
    executions = ExecutionSummarySerializer(many=True)
