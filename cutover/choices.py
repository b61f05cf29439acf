from django.db import models


class DecisionState(models.TextChoices):
    ROLLBACK_OPEN = "rollback_open"  # initial (entering v2_validating, decision 11)
    ACTIVATING_V2 = "activating_v2"  # rollback_open -> activating_v2 (activation wins)
    V2_COMMITTED = "v2_committed"  # activating_v2 -> v2_committed (activation readback)
    RESTORING_V1 = "restoring_v1"  # rollback_open -> restoring_v1 (restore wins)
    V1_RESTORED = "v1_restored"  # restoring_v1 -> v1_restored (restore completed)


DECISION_TRANSITIONS = (
    (DecisionState.ROLLBACK_OPEN, DecisionState.ACTIVATING_V2),
    (DecisionState.ACTIVATING_V2, DecisionState.V2_COMMITTED),
    (DecisionState.ROLLBACK_OPEN, DecisionState.RESTORING_V1),
    (DecisionState.RESTORING_V1, DecisionState.V1_RESTORED),
)


class BarrierSetState(models.TextChoices):
    ACQUIRING = "acquiring"  # initial (barrier_set_acquire writes it before requesting owner fences, CV2-11-037)
    HELD = "held"  # acquiring -> held (barrier_set_hold: owners reread and receipts frozen, CV2-11-027)
    ACTIVATION_COMMITTED = "activation_committed"  # held -> activation_committed (successor_activate, CV2-11-029)
    RELEASED = "released"  # acquiring|held|activation_committed -> released (barrier_set_release); terminal


BARRIER_SET_TRANSITIONS = (
    (BarrierSetState.ACQUIRING, BarrierSetState.HELD),
    (BarrierSetState.ACQUIRING, BarrierSetState.RELEASED),
    (BarrierSetState.HELD, BarrierSetState.ACTIVATION_COMMITTED),
    (BarrierSetState.HELD, BarrierSetState.RELEASED),
    (BarrierSetState.ACTIVATION_COMMITTED, BarrierSetState.RELEASED),
)
BARRIER_SET_OPEN = (BarrierSetState.ACQUIRING, BarrierSetState.HELD, BarrierSetState.ACTIVATION_COMMITTED)


class SuccessionDrainState(models.TextChoices):
    """The drain phase of one successor attempt (CV2-11-005, D-315): continuation work of the predecessor drains
    under `v2_serving` gates while new roots of the predecessor are refused. No state changes because time passed."""

    DRAINING = "draining"  # initial (succession_drain_open, under a held barrier set; new roots refused)
    DRAINED = "drained"  # draining -> drained (succession_drain_complete: the inventory measured empty)
    RELEASED = "released"  # draining|drained -> released (the barrier set's release: roots reopen); terminal


SUCCESSION_DRAIN_TRANSITIONS = (
    (SuccessionDrainState.DRAINING, SuccessionDrainState.DRAINED),
    (SuccessionDrainState.DRAINING, SuccessionDrainState.RELEASED),
    (SuccessionDrainState.DRAINED, SuccessionDrainState.RELEASED),
)
# The states in which the predecessor's new roots are refused (the trigger of migration 0014 names them too).
SUCCESSION_DRAIN_CLOSED = (SuccessionDrainState.DRAINING, SuccessionDrainState.DRAINED)


class BarrierOwnerKind(models.TextChoices):
    """The external owners whose publication barrier a set holds (CV2-11-033, CV2-15-009): one receipt each for
    Catalog, the L2 configuration owner and credential authority, and one per binding-definition owner (the
    kind-specific owner reader of each closed binding kind the candidate binds, connector.selectors.owners)."""

    CATALOG = "catalog"
    BINDING_DEFINITION = "binding_definition"
    CONFIGURATION = "configuration"
    CREDENTIAL_AUTHORITY = "credential_authority"


# The owners of which a set holds exactly one receipt whatever the candidate binds.
SINGLE_OWNER_KINDS = (BarrierOwnerKind.CATALOG, BarrierOwnerKind.CONFIGURATION, BarrierOwnerKind.CREDENTIAL_AUTHORITY)


class SuccessorClass(models.TextChoices):
    """The closed set of successor transition classes. Only `requires_drain` is authorized (CV2-11-002/003);
    `online_compatible` is named so that it can be refused by name (CV2-11-058)."""

    REQUIRES_DRAIN = "requires_drain"
    ONLINE_COMPATIBLE = "online_compatible"  # never authorized


SUPPORTED_SUCCESSOR_CLASSES = (SuccessorClass.REQUIRES_DRAIN,)


class RestoreAttemptState(models.TextChoices):
    """One full V1 restore (seed step 10b, CV2-12-073..075). Each state is a durable boundary a crashed
    coordinator resumes from; no state changes because time passed."""

    STARTED = "started"  # initial: the CutoverDecision moved rollback_open -> restoring_v1 for this attempt
    DATABASE_RESTORED = "database_restored"  # started -> database_restored (pg_restore committed, digests verified)
    RECEIPT_RECORDED = "receipt_recorded"  # database_restored -> receipt_recorded (recovery receipt durable,
    # CutoverDecision v1_restored)
    V1_SERVING = "v1_serving"  # receipt_recorded -> v1_serving (new V1 generation, gates v1_serving); terminal


RESTORE_ATTEMPT_TRANSITIONS = (
    (RestoreAttemptState.STARTED, RestoreAttemptState.DATABASE_RESTORED),
    (RestoreAttemptState.DATABASE_RESTORED, RestoreAttemptState.RECEIPT_RECORDED),
    (RestoreAttemptState.RECEIPT_RECORDED, RestoreAttemptState.V1_SERVING),
)
