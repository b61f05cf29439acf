"""REST bulk delivery models (docs/contracts/rest-bulk-delivery-design.v1.yaml), one module per aggregate:
receivers (approval receipt, bindings, secret versions, certifications), profiles (and the remote job semaphore),
domains (effect conflict domain locks, range watermarks), operations (parent plans, child operations with the
contract's five-axis state machine), attempts (MAY_ATTEMPT markers, attempts, observations) and journal (mutation
gate, reconciliation campaigns, reconciliations, journal epoch attestations). Their closed vocabularies are in
effects/choices.py.
"""
from __future__ import annotations

from effects.models.delivery.receivers import *  # noqa: F401,F403
from effects.models.delivery.profiles import *  # noqa: F401,F403
from effects.models.delivery.domains import *  # noqa: F401,F403
from effects.models.delivery.operations import *  # noqa: F401,F403
from effects.models.delivery.attempts import *  # noqa: F401,F403
from effects.models.delivery.journal import *  # noqa: F401,F403

# Migration 0005 names `effects.models.delivery.DeliveryTransitions` as a base of DeliveryOperation; it stays here.
__all__ = [
    "DeliveryApprovalReceipt", "ReceiverBinding", "ReceiverSecretVersion", "ReceiverCertification",
    "CertificationApproval", "DeliveryProfile", "RemoteJobSemaphore", "EffectDomainLock", "DeliveryParent",
    "DeliveryOperation", "MayAttemptMarker", "DeliveryAttempt", "DeliveryObservation", "DeliveryWatermark",
    "MutationGate", "ReconciliationCampaign", "DeliveryReconciliation", "JournalEpochAttestation",
]
