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
