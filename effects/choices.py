"""Closed vocabularies of the outbound chain (each state's comment names the transition that enters it) and of REST
bulk delivery (its operation states are the contract's tuples, effects.models.delivery.operations)."""
from __future__ import annotations

from django.db import models


class EffectState(models.TextChoices):
    PREPARED = "prepared"  # initial; dispatching|uncertain -> prepared (proved no effect / idempotent repeat)
    DISPATCHING = "dispatching"  # prepared -> dispatching (permit_acquire)
    REMOTE_CONFIRMED = "remote_confirmed"  # dispatching|uncertain -> remote_confirmed
    UNCERTAIN = "uncertain"  # dispatching -> uncertain (ambiguous outcome, sending permit abandoned)
    NO_EFFECT = "no_effect"  # dispatching|uncertain -> no_effect (proved, policy forbids another attempt)
    QUARANTINED = "quarantined"  # prepared|uncertain -> quarantined
    FINALIZED = "finalized"  # remote_confirmed -> finalized


EFFECT_TRANSITIONS = (
    (EffectState.PREPARED, EffectState.DISPATCHING),
    (EffectState.PREPARED, EffectState.QUARANTINED),
    (EffectState.DISPATCHING, EffectState.REMOTE_CONFIRMED),
    (EffectState.DISPATCHING, EffectState.UNCERTAIN),
    (EffectState.DISPATCHING, EffectState.NO_EFFECT),
    (EffectState.DISPATCHING, EffectState.PREPARED),
    (EffectState.UNCERTAIN, EffectState.REMOTE_CONFIRMED),
    (EffectState.UNCERTAIN, EffectState.NO_EFFECT),
    (EffectState.UNCERTAIN, EffectState.QUARANTINED),
    (EffectState.UNCERTAIN, EffectState.PREPARED),
    (EffectState.REMOTE_CONFIRMED, EffectState.FINALIZED),
)
EFFECT_TERMINAL = (EffectState.NO_EFFECT, EffectState.QUARANTINED, EffectState.FINALIZED)
# The holds on an `uncertain` effect whose automatic recovery under its frozen idempotency contract stopped
# (effects.services.recovery, D-433): it waits for a person; leaving `uncertain` lifts the hold.
UNCERTAIN_HOLDS = ("UNCERTAIN_REPEATS_SPENT", "UNCERTAIN_KEY_RETENTION_PASSED")

# The retry schedule (seconds) of attempts that never reached the receiver when the callout declares none (D-420):
# Svix's, about 27.6 hours in all, so an outage of a day is outlasted.
DEFAULT_RETRY_SCHEDULE = (5, 300, 1800, 7200, 18000, 36000, 36000)


class NoEffectReason(models.TextChoices):
    """Closed reason codes of a terminal `no_effect` the frozen policy decided (D-423)."""
    RECEIVER_UNREACHABLE = "RECEIVER_UNREACHABLE"  # dispatching -> no_effect: the retry schedule is spent
    ATTEMPTS_SPENT = "NO_EFFECT_ATTEMPTS_SPENT"  # dispatching|uncertain -> no_effect: max_attempts proved no effect
    PATH_UNSAFE = "OUTBOUND_PATH_UNSAFE"  # dispatching -> no_effect: the frozen path can never be sent
    # dispatching|uncertain -> no_effect: max_attempts spent, the last refusal a 404 to an update addressed at the
    # slot's linked remote identity (the record the RemoteLink names is not at the provider, D-481)
    LINKED_RECORD_NOT_FOUND = "LINKED_RECORD_NOT_FOUND"


class PermitState(models.TextChoices):
    GRANTED = "granted"  # initial (permit_acquire)
    SENDING = "sending"  # granted -> sending (egress adapter CAS, io_may_have_started)
    RETURNED = "returned"  # sending -> returned (permit_settle)
    ABANDONED = "abandoned"  # granted|sending -> abandoned (permit_abandon with holder isolation proof)


PERMIT_TRANSITIONS = (
    (PermitState.GRANTED, PermitState.SENDING),
    (PermitState.GRANTED, PermitState.ABANDONED),
    (PermitState.SENDING, PermitState.RETURNED),
    (PermitState.SENDING, PermitState.ABANDONED),
)
PERMIT_OPEN = (PermitState.GRANTED, PermitState.SENDING)


class LinkState(models.TextChoices):
    ACTIVE = "active"  # initial (effect finalization with a proven remote identity)
    RETIRED = "retired"  # active -> retired


LINK_TRANSITIONS = ((LinkState.ACTIVE, LinkState.RETIRED),)


class HolderState(models.TextChoices):
    RUNNING = "running"  # initial (holder_register)
    TERMINATED = "terminated"  # running -> terminated (holder_terminate: process ended and egress revoked)


HOLDER_TRANSITIONS = ((HolderState.RUNNING, HolderState.TERMINATED),)


class AttemptOutcome(models.TextChoices):
    REMOTE_CONFIRMED = "remote_confirmed"
    UNCERTAIN = "uncertain"
    NO_EFFECT = "no_effect"


# -- REST bulk delivery ---------------------------------------------------------------------------------------


class AuthenticationMode(models.TextChoices):
    BEARER = "bearer"
    API_KEY_HEADER = "api_key_header"
    HTTP_BASIC = "http_basic"
    OAUTH2_CLIENT_CREDENTIALS = "oauth2_client_credentials"
    MTLS = "mtls"
    API_KEY_QUERY = "api_key_query"  # refused unless every exception requirement is recorded


class CertificationState(models.TextChoices):
    PENDING_APPROVAL = "pending_approval"  # platform_attested, waiting for two distinct approvers
    CERTIFIED = "certified"
    EXPIRED = "expired"  # valid_until passed: periodic recertification due
    REFUSED = "refused"  # pending_approval -> refused: an approver refused it with a reason (D-464); terminal


class ParentState(models.TextChoices):
    PLANNING = "PLANNING"
    ADMITTED = "ADMITTED"


class CapacityState(models.TextChoices):
    RESERVED = "reserved"
    RELEASED = "released"
    TRANSFERRED = "transferred"  # audited incident capacity transfer


class GateState(models.TextChoices):
    ENABLED = "ENABLED"
    BLOCKED = "BLOCKED"
