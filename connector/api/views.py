"""Connector V2 HTTP API: transport admission, replay admission and receipt reads (docs/api.md).

Views are thin (STYLE R14): one APIView per operation, nested plain Input/OutputSerializers, every write through
one service, every domain error mapped by the one EXCEPTION_HANDLER (connector.api.exceptions). Who may call
what (decision D-111): transport admission is authenticated only by the HMAC `Connector-Signature` keyed by the
account's exact signing credential generation; replay and reads are operator actions by Django users holding a
model permission (HTTP Basic or a session)."""
from __future__ import annotations

import logging
from functools import partial

from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.db import transaction
from django.db.models import Prefetch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import RedisError
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from connector import tasks, tracing
from connector.actors import Actor
from connector.api.common import (
    ACCOUNT_PARAM,
    COMMON_ERRORS,
    OPERATOR_AUTHENTICATION,
    OPERATOR_ERRORS,
    RETRY_AFTER,
    JsonRegardlessOfAccept,
    RawBodyParser,
    error_response,
    model_permission,
)
from connector.api.exceptions import BodyTooLarge
from connector.api.parsers import BoundedJSONParser
from connector.api.serializers import (
    EpochRefSerializer,
    ExactTextField,
    HexDigestField,
    ReceiptComponentSerializer,
    ReceiptEventSerializer,
    ReplayedEventSerializer,
    ReplayPredecessorSerializer,
    V1PredecessorInputSerializer,
    V1PredecessorRefSerializer,
)
from connector.api.transport import idempotency_key_from
from connector.errors import ConnectorError, GateNotServing
from connector.models import Event, Execution, Receipt, ReceiptComponent, ReplayRequest
from connector.selectors.routes import ChannelNotFound, route_for
from connector.services.admission import (Admission, AdmissionHint, HintStale, account_get, admission_hint_cached,
                                         admission_hint_get, receipt_admit)
from connector.selectors.replay import replay_data
from connector.services.owners import ident
from connector.services.replay import replay_request_admit, replay_request_settle
from connector.services.replay_v1 import V1Predecessor
from connector.services.signatures import SignatureInvalid, signature_verify

log = logging.getLogger(__name__)

TRANSPORT = Actor.system("transport-admission")


# -- shared helpers ------------------------------------------------------------------------------------------------

def _raw_body(request) -> bytes:
    try:
        return bytes(request.body)
    except RequestDataTooBig as exc:
        raise BodyTooLarge() from exc


def _materialization_enqueue(receipt_pk: int, account_id: int | None = None) -> None:
    """Wake the account's batch materializer, once per burst (debounced, D-269): a wake pending for the account
    covers this receipt. Redis only wakes workers: when the broker is unreachable the sweeper still materializes
    from the MaterializationDue row written with the receipt (decision D-106), so a failed enqueue is logged and
    never fails the request that already committed. Without an account, the single-receipt task as before."""
    try:
        if account_id is None:
            tasks.receipt_materialize.delay(receipt_pk, account_id)
        else:
            tasks.materialization_wake(account_id, tasks.slot_of(receipt_pk))
    except (KombuOperationalError, RedisError, OSError) as exc:
        log.warning("materialization enqueue failed; the sweeper will materialize the receipt",
                    extra={"receipt": receipt_pk, "error": f"{type(exc).__name__}: {exc}"})


def _claims_wake() -> None:
    """Wake a worker to claim the execution a replay just minted (the sweeper finds it anyway)."""
    try:
        tasks.execution_claim_and_run.delay()
    except (KombuOperationalError, RedisError, OSError) as exc:
        log.warning("claim wake-up not sent; the sweeper will find the execution",
                    extra={"error": f"{type(exc).__name__}: {exc}"})


def _schedule_materialization(receipt_pk: int, account_id: int) -> None:
    transaction.on_commit(partial(_materialization_enqueue, receipt_pk, account_id), robust=True)


# -- transport admission -------------------------------------------------------------------------------------------

class ReceiptAdmitApi(APIView):
    """Admit one transport delivery exactly once (CV2-05-001..006, CV2-05-009, CV2-05-016).

    Order of checks, each refusing before anything is written: the account (404 ACCOUNT_NOT_FOUND), the gate's
    epoch and the channel as an enabled inbound route of that epoch (503 GATE_NOT_SERVING, 404
    CHANNEL_NOT_FOUND), the signature over the exact body (401 SIGNATURE_INVALID), then `receipt_admit` (key,
    duplicate resolution, serving guard, whole-body parse)."""

    authentication_classes: list = []  # the HMAC signature is the only authentication (no session, no CSRF)
    permission_classes = [AllowAny]
    parser_classes = [RawBodyParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JsonRegardlessOfAccept

    @extend_schema_serializer(component_name="ReceiptAdmission")
    class OutputSerializer(serializers.Serializer):
        receipt = serializers.IntegerField(allow_null=True, help_text="The Receipt's id; null for v1_accepted.")
        admission = serializers.ChoiceField(choices=["created", "duplicate", "v1_accepted"])
        epoch = EpochRefSerializer(allow_null=True, help_text="The epoch that admitted the (original) Receipt.")
        component_count = serializers.IntegerField(allow_null=True)

    @extend_schema(
        operation_id="receipt_admit",
        summary="Admit one transport delivery",
        description=(
            "The body is taken as the exact bytes received (any content type) and parsed by the channel's frozen "
            "inbound route. `Connector-Signature` is verified before admission; `Idempotency-Key` names the "
            "delivery in the (account, channel) key namespace shared with imported V1 tombstones. A retry with "
            "the same key and bytes returns the original Receipt and its epoch."),
        parameters=[
            ACCOUNT_PARAM,
            OpenApiParameter("channel", OpenApiTypes.STR, OpenApiParameter.PATH,
                             description="The inbound route's business key, enabled for the account."),
            OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True,
                             description="Canonical UTF-8 text, 1..255 code points, no edge whitespace, no "
                                         "control or format characters, NFC. Never trimmed."),
            OpenApiParameter("Connector-Signature", OpenApiTypes.STR, OpenApiParameter.HEADER, required=True,
                             description="`t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"<t>.\" + body)>`, "
                                         "keyed by the account's signing credential generation."),
            RETRY_AFTER,
        ],
        request={"*/*": OpenApiTypes.BINARY},
        responses={
            201: OpenApiResponse(OutputSerializer, description="A new Receipt (`admission: created`)."),
            200: OpenApiResponse(OutputSerializer, description=(
                "`admission: duplicate` (the original Receipt and epoch) or `v1_accepted` (a V1 tombstone "
                "holds the key; no Receipt, `receipt` is null).")),
            400: error_response("`NONCANONICAL_KEY`, `BODY_UNPARSEABLE`, `OWNER_FACT_INVALID`."),
            401: error_response("`SIGNATURE_INVALID`."),
            404: error_response("`ACCOUNT_NOT_FOUND`, `CHANNEL_NOT_FOUND`, `NOT_FOUND`."),
            409: error_response("`RECEIPT_DIGEST_MISMATCH`."),
            413: error_response("`BODY_TOO_LARGE`."),
            503: error_response("`GATE_NOT_SERVING`, `OWNER_UNAVAILABLE`; retry after `Retry-After` seconds."),
            **COMMON_ERRORS,
            500: error_response("`INTERNAL_ERROR` (unexpected, logged) or `ROUTE_DEFINITION_INVALID` (an operator must "
                        "install a corrected pack generation)."),
        },
        examples=[OpenApiExample("created", response_only=True, status_codes=["201"], value={
            "receipt": 42, "admission": "created", "epoch": {"id": "epoch-1", "digest": "ab" * 32},
            "component_count": 2})],
        tags=["admission"],
    )
    def post(self, request, account: str, channel: str) -> Response:
        data, code = admit_signed_delivery(None, request, account, channel)
        return Response(data, status=code)


@tracing.http_entry("receipt_admit")  # logs carry the ids; the span continues a caller's traceparent
def admit_signed_delivery(_view, request, account: str, channel: str) -> tuple[dict, int]:
    """ReceiptAdmitApi's and receipt_admit_direct's admission (D-540): the answer's data and status."""
    body = _raw_body(request)  # the exact bytes, before anything could parse them
    admission = _verified_admission(request, account, channel, body)
    if admission.outcome == "created":
        _schedule_materialization(admission.receipt.pk, admission.receipt.account_id)
    return _admission_data(admission), (201 if admission.outcome == "created" else 200)


def _verified_admission(request, account_key: str, channel: str, body: bytes) -> Admission:
    """Verify the signature with the signing credential of one exact epoch and admit only under that epoch (D-297).
    The epoch is this process's last hint for the account when it has one (no round trip), else read from the
    gate. Nothing trusts the cached hint: the admission writes only if the rows it locks are exactly the hint
    (HintStale otherwise, nothing written), and a refusal of the channel or the signature under a cached hint is
    only final once the gate's current epoch refuses it too. Either way the request is re-verified against the
    epoch that admits it, so a body signed for a superseded credential never enters under its successor."""
    header = request.META.get("HTTP_CONNECTOR_SIGNATURE")
    hint = admission_hint_cached(account_key)
    fresh = hint is None
    if fresh:
        hint = _channel_check(account_key, channel)
    for _attempt in range(3):
        try:
            if not fresh:
                route_for(epoch_pk=hint.epoch_pk, epoch_digest=hint.epoch_digest, account_id=hint.account_pk,
                          channel=channel)
            signature_verify(account_id=hint.account_pk, channel=channel, header=header, body=body,
                             epoch_pk=hint.epoch_pk, epoch_digest=hint.epoch_digest)
            return receipt_admit(account_key=account_key, channel=channel,
                                 transport_key=idempotency_key_from(request.META), body=body, actor=TRANSPORT,
                                 hint=hint, hint_fixed=True)
        except (ChannelNotFound, SignatureInvalid):
            if fresh:
                raise
        except HintStale:
            pass
        hint, fresh = _channel_check(account_key, channel), True
    raise GateNotServing(f"account {account_key!r} gate kept moving between epochs; retry")


def _channel_check(account_key: str, channel: str) -> AdmissionHint:
    """The account (ACCOUNT_NOT_FOUND) and its gate's current epoch, read once; the channel must be an enabled
    inbound route of that epoch. A gate naming no epoch has no route to check and no signing key: it is not
    serving (admission would refuse it under its lock anyway). The answer is the hint the admission statement
    re-checks under its locks (D-202)."""
    hint = admission_hint_get(account_key)
    if hint is None:
        raise GateNotServing(f"account {account_key!r} gate names no epoch; no epoch serves it")
    route_for(epoch_pk=hint.epoch_pk, epoch_digest=hint.epoch_digest, account_id=hint.account_pk, channel=channel)
    return hint


def _admission_data(admission: Admission) -> dict:  # ReceiptAdmitApi.OutputSerializer's representation
    receipt = admission.receipt
    if receipt is None:  # v1_accepted: the key belongs to a V1 tombstone, there is no V2 descendant
        return {"receipt": None, "admission": admission.outcome, "epoch": None, "component_count": None}
    return {"receipt": receipt.pk, "admission": admission.outcome,
            "epoch": {"id": receipt.epoch.epoch_id, "digest": bytes(receipt.epoch_digest).hex()},
            "component_count": receipt.component_count}


# -- replay admission ----------------------------------------------------------------------------------------------

class ReplayRequestAdmitApi(APIView):
    """Admit one operator-authorized replay (CV2-09-001, CV2-09-005, CV2-09-006, CV2-09-010, CV2-09-017)."""

    authentication_classes = OPERATOR_AUTHENTICATION
    renderer_classes = [JSONRenderer]
    permission_classes = [model_permission("connector.add_replayrequest")]
    parser_classes = [BoundedJSONParser]

    @extend_schema_serializer(component_name="ReplayRequestAdmitInput")
    class InputSerializer(serializers.Serializer):
        request_id = ExactTextField(allow_blank=True, help_text="Stable replay request ID (canonical identity).")
        target_epoch = EpochRefSerializer()
        predecessor = ReplayPredecessorSerializer(required=False, help_text="A V2 Event, or give `v1_predecessor`.")
        v1_predecessor = V1PredecessorInputSerializer(required=False, help_text="A V1 item (D-331), or `predecessor`.")
        reason = ExactTextField(allow_blank=True)
        principal = ExactTextField(allow_blank=True, help_text="The authorizing principal, bound into the request.")
        mode = ExactTextField(allow_blank=True, help_text="Must be `suppress_external_effects`.")

    @extend_schema_serializer(component_name="ReplayRequestAdmission")
    class OutputSerializer(serializers.Serializer):
        request = serializers.IntegerField(help_text="The ReplayRequest's id.")
        request_id = serializers.CharField()
        receipt = serializers.IntegerField(help_text="The replay Receipt's id.")
        admission = serializers.ChoiceField(choices=["created", "duplicate"])
        target_epoch = EpochRefSerializer()
        v1_predecessor = V1PredecessorRefSerializer(allow_null=True, help_text="The V1 predecessor evidence, if any.")
        events = ReplayedEventSerializer(many=True, help_text="The disposition of each replayed event.")

    @extend_schema(
        operation_id="replay_request_admit",
        summary="Admit one replay request",
        description=(
            "Creates an immutable ReplayRequest and its inert replay Receipt, which copies the exact predecessor "
            "component bytes, then materializes it and takes one lane step, and answers what became of each "
            "replayed event (`events`): `superseded` at or below the lane high-water (Runtime not called), an "
            "`execution` of the replay's generation with external effects suppressed, `waiting` (and why), or "
            "`materialization_pending` when the gate moved meanwhile (the sweeper finishes it). The same "
            "`request_id` with the same bytes returns the same ids (`duplicate`) with the current dispositions; with "
            "different bytes `REPLAY_MISMATCH`. Requires the permission `connector.add_replayrequest` (the "
            "operator role)."),
        parameters=[ACCOUNT_PARAM, RETRY_AFTER],
        request=InputSerializer,
        responses={
            201: OpenApiResponse(OutputSerializer, description="A new ReplayRequest and replay Receipt."),
            200: OpenApiResponse(OutputSerializer, description="`duplicate`: the existing request and receipt."),
            400: error_response("`REQUEST_INVALID`, `IDENTITY_INVALID`, `REPLAY_MODE_REFUSED`."),
            **OPERATOR_ERRORS,
            404: error_response("`ACCOUNT_NOT_FOUND`, `NOT_FOUND`."),
            409: error_response("`REPLAY_MISMATCH`."),
            413: error_response("`BODY_TOO_LARGE`."),
            415: error_response("`UNSUPPORTED_MEDIA_TYPE`: send `application/json`."),
            422: error_response("`REPLAY_PREDECESSOR_INVALID`, `REPLAY_V1_PREDECESSOR_UNKNOWN`."),
            503: error_response("`GATE_NOT_SERVING` (also when `target_epoch` is not the gate's exact active epoch)."),
            **COMMON_ERRORS,
        },
        tags=["replay"],
    )
    def post(self, request, account: str) -> Response:
        _raw_body(request)  # enforces DATA_UPLOAD_MAX_MEMORY_SIZE, which DRF's JSONParser does not check
        s = self.InputSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        data = s.validated_data
        v2, v1 = data.get("predecessor") or {}, data.get("v1_predecessor")
        admission = replay_request_admit(
            account_key=account, request_id=data["request_id"], target_epoch_id=data["target_epoch"]["id"],
            target_epoch_digest=data["target_epoch"]["digest"], predecessor_event_id=v2.get("event_id"),
            predecessor_payload_digest=v2.get("payload_digest"), v1_predecessor=V1Predecessor(**v1) if v1 else None,
            reason=data["reason"], principal=data["principal"], mode=data["mode"], actor=Actor.for_user(request.user))
        if admission.outcome == "created":
            if replay_request_settle(request_pk=admission.request.pk):
                _claims_wake()
            else:
                _schedule_materialization(admission.receipt.pk, admission.receipt.account_id)  # the gate moved meanwhile: a worker retries
        out = self.OutputSerializer(replay_data(admission.request, admission=admission.outcome))
        return Response(out.data, status=status.HTTP_201_CREATED if admission.outcome == "created"
                        else status.HTTP_200_OK)


class ReplayRequestDetailApi(APIView):
    """One ReplayRequest of the account and the current disposition of each event it replayed (D-194)."""

    authentication_classes = OPERATOR_AUTHENTICATION
    renderer_classes = [JSONRenderer]
    permission_classes = [model_permission("connector.view_replayrequest")]

    @extend_schema_serializer(component_name="ReplayRequestDetail")
    class OutputSerializer(serializers.Serializer):
        request = serializers.IntegerField()
        request_id = serializers.CharField()
        receipt = serializers.IntegerField()
        target_epoch = EpochRefSerializer()
        v1_predecessor = V1PredecessorRefSerializer(allow_null=True, help_text="The V1 predecessor evidence, if any.")
        events = ReplayedEventSerializer(many=True)

    @extend_schema(
        operation_id="replay_request_get",
        summary="Read one replay request and its dispositions",
        description="Requires the permission `connector.view_replayrequest`.",
        parameters=[ACCOUNT_PARAM],
        responses={200: OutputSerializer, **OPERATOR_ERRORS,
                   404: error_response("`ACCOUNT_NOT_FOUND`, or `NOT_FOUND` (no such replay request in this account)."),
                   **COMMON_ERRORS},
        tags=["replay"],
    )
    def get(self, request, account: str, request_id: str) -> Response:
        owner = account_get(account)
        try:  # an ID that is not a canonical identity names no replay request (and never reaches a query)
            canonical = ident(request_id, "request_id")
        except ConnectorError:
            canonical = None
        replay = (ReplayRequest.objects.select_related("receipt", "target_epoch").defer("target_epoch__preimage")
                  .filter(account=owner, request_id=canonical).first()) if canonical == request_id else None
        if replay is None:
            raise NotFound(f"no replay request {request_id!r} in account {account!r}")
        return Response(self.OutputSerializer(replay_data(replay)).data)


# -- reads ---------------------------------------------------------------------------------------------------------
# Every query is scoped by the account named in the URL; payload bytes are never returned (digests only).

def _receipt_get(*, account_key: str, receipt_id: int, queryset=None) -> Receipt:
    account = account_get(account_key)
    queryset = queryset if queryset is not None else Receipt.objects.select_related("account", "epoch")
    receipt = queryset.defer("payload", "epoch__preimage").filter(account=account, pk=receipt_id).first()
    if receipt is None:
        raise NotFound(f"no receipt {receipt_id} in account {account_key!r}")
    return receipt


def _one(obj, attr: str):
    """A reverse one-to-one or nullable relation, or None."""
    if obj is None:
        return None
    try:
        return getattr(obj, attr)
    except ObjectDoesNotExist:
        return None


class ReceiptDetailApi(APIView):
    """One Receipt of the account with its epoch, kind and components (CV2-05-009, CV2-05-011, CV2-05-015)."""

    authentication_classes = OPERATOR_AUTHENTICATION
    renderer_classes = [JSONRenderer]
    permission_classes = [model_permission("connector.view_receipt")]

    @extend_schema_serializer(component_name="ReceiptDetail")
    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        account = serializers.CharField(source="account.account_key")
        kind = serializers.CharField(help_text="transport | replay")
        channel = serializers.CharField()
        epoch = serializers.SerializerMethodField()
        gate_fence = serializers.IntegerField()
        payload_digest = HexDigestField()
        component_count = serializers.IntegerField()
        materialized_component_count = serializers.SerializerMethodField()
        materialization_pending = serializers.SerializerMethodField()
        replay_request = serializers.SerializerMethodField(help_text="The ReplayRequest ID of a replay receipt.")
        created_at = serializers.DateTimeField()
        components = ReceiptComponentSerializer(many=True)

        @extend_schema_field(EpochRefSerializer)
        def get_epoch(self, receipt) -> dict:
            return EpochRefSerializer({"id": receipt.epoch.epoch_id, "digest": bytes(receipt.epoch_digest)}).data

        def get_materialized_component_count(self, receipt) -> int:
            return len(receipt.components.all())

        def get_materialization_pending(self, receipt) -> bool:
            return _one(receipt, "materialization_due") is not None

        def get_replay_request(self, receipt) -> str | None:
            return receipt.replay_request.request_id if receipt.replay_request_id else None

    @extend_schema(
        operation_id="receipt_get",
        summary="Read one receipt",
        description="Requires the permission `connector.view_receipt`. Payload bytes are never returned.",
        parameters=[ACCOUNT_PARAM],
        responses={200: OutputSerializer, **OPERATOR_ERRORS,
                   404: error_response("`ACCOUNT_NOT_FOUND`, or `NOT_FOUND` (no such receipt in this account)."),
                   **COMMON_ERRORS},
        tags=["reads"],
    )
    def get(self, request, account: str, receipt_id: int) -> Response:
        receipt = _receipt_get(account_key=account, receipt_id=receipt_id, queryset=(
            Receipt.objects.select_related("account", "epoch", "replay_request", "materialization_due")
            .prefetch_related(Prefetch("components", ReceiptComponent.objects.defer("payload").order_by("ordinal")))))
        return Response(self.OutputSerializer(receipt).data)


_SOLE_PROJECTION = ("event__projection", "event__window_member__window__projection")


class ReceiptEventListApi(APIView):
    """The Events a Receipt's components produced or linked, with their projection, ordering decision, window
    and executions (CV2-05-011, CV2-05-012, CV2-05-015)."""

    authentication_classes = OPERATOR_AUTHENTICATION
    renderer_classes = [JSONRenderer]
    permission_classes = [model_permission("connector.view_receipt")]

    @extend_schema_serializer(component_name="ReceiptEvents")
    class OutputSerializer(serializers.Serializer):
        receipt = serializers.IntegerField()
        events = ReceiptEventSerializer(many=True)

    @extend_schema(
        operation_id="receipt_event_list",
        summary="List the events of one receipt",
        description=("One entry per materialized component that produced (`event`) or linked "
                     "(`duplicate_event`) an Event, in ordinal order. Requires `connector.view_receipt`."),
        parameters=[ACCOUNT_PARAM],
        responses={200: OutputSerializer, **OPERATOR_ERRORS,
                   404: error_response("`ACCOUNT_NOT_FOUND`, or `NOT_FOUND` (no such receipt in this account)."),
                   **COMMON_ERRORS},
        tags=["reads"],
    )
    def get(self, request, account: str, receipt_id: int) -> Response:
        receipt = _receipt_get(account_key=account, receipt_id=receipt_id)
        executions = Execution.objects.order_by("pk")
        components = (
            ReceiptComponent.objects.defer("payload")
            .filter(receipt=receipt, event__isnull=False, event__account_id=receipt.account_id)
            .select_related("event__epoch", "event__replay_request", *_SOLE_PROJECTION,
                            *(f"{p}__superseded" for p in _SOLE_PROJECTION))
            .defer("event__payload", "event__epoch__preimage", *(f"{p}__input" for p in _SOLE_PROJECTION))
            .prefetch_related(*(Prefetch(f"{p}__executions", executions.defer("execution_ref", "runtime_receipt"))
                                for p in _SOLE_PROJECTION))
            .order_by("ordinal"))
        events = []
        for component in components:
            event: Event = component.event
            member = _one(event, "window_member")
            window = member.window if member is not None else None
            projection = _one(event, "projection") or _one(window, "projection")
            events.append({
                "id": event.pk, "component_ordinal": component.ordinal,
                "component_disposition": component.disposition, "source_event_key": event.source_event_key,
                "event_kind": event.event_kind, "source_locator": event.source_locator,
                "occurred_at": event.occurred_at, "route": event.route, "epoch": event.epoch,
                "partition": event.partition, "position": event.position,
                "payload_digest": event.payload_digest,
                "replay_request": event.replay_request.request_id if event.replay_request_id else None,
                "predecessor": event.predecessor_id,
                "projection": projection.pk if projection is not None else None,
                "window": window.pk if window is not None else None,
                "superseded": _one(projection, "superseded"),
                "executions": list(projection.executions.all()) if projection is not None else [],
            })
        return Response(self.OutputSerializer({"receipt": receipt.pk, "events": events}).data)
