"""Operator-only transitions (the contract's `operator_only_transitions`): opening a reconciliation of an unknown,
partial or unverified final tuple, and resolving it with proof. Each needs a reconciliation ID and the approval
of a real user holding `effects.reconcile_delivery` (the django-fsm permission of the generated
`reconcile_to_<tuple>` methods); a resolution also needs the proof its CAS kind names:
- effect_proof: {"applied_count": n, "source": ...}; the count must agree with the target's remote effect
  (0 -> none proven, the record count -> fully applied, in between -> partially applied);
- evidence_digest: {"evidence_digest": 64 hex} (the effect stays UNKNOWN);
- verification_proof: {"verified_count": records, "payload_sha256": the sealed payload's digest}.
The acknowledgement axis never changes (the contract's tuples guarantee it). Capacity held for an unknown or
partial effect is released when the reconciliation resolves it (or transferred by an audited incident)."""
from __future__ import annotations

import hashlib

from django.db import IntegrityError, transaction
from django_fsm import has_transition_perm

from connector.actors import Actor
from connector.errors import StateTokenInvalid
from connector.services.audit import audit_record
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryPermissionDenied, DeliveryRequestInvalid
from effects.models import DeliveryOperation, DeliveryParent, DeliveryReconciliation

from . import finalization
from .execution import operation_for_update
from .planning import domain_lock_for_update
from .setup import canonical_json

PERMISSION = "effects.reconcile_delivery"


def _require(actor: Actor, op: DeliveryOperation, method: str) -> None:
    if actor.user is None or not actor.user.is_active:
        raise DeliveryPermissionDenied("a reconciliation is approved by a signed-in operator, never by the system")
    if not has_transition_perm(getattr(op, method), actor.user):
        raise DeliveryPermissionDenied(f"{actor} may not {method} from {op.state} (needs {PERMISSION})")


def _check_proof(op: DeliveryOperation, target: str, kind: str | None, proof: dict | None) -> bytes | None:
    c = contract()
    if kind is None:
        return None
    if not isinstance(proof, dict):
        raise DeliveryRequestInvalid(f"this resolution needs a {kind}")
    effect = c.axis(target, "remote_effect")
    if kind == "effect_proof":
        n = proof.get("applied_count")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not proof.get("source"):
            raise DeliveryRequestInvalid("an effect proof names its source and the applied count")
        expected = {"NONE_PROVEN": n == 0, "FULLY_APPLIED": n == op.record_count,
                    "PARTIALLY_APPLIED": 0 < n < op.record_count}.get(effect, False)
        if not expected:
            raise DeliveryRequestInvalid(f"{n} applied of {op.record_count} does not prove {effect}")
    elif kind == "evidence_digest":
        digest = proof.get("evidence_digest", "")
        if not (isinstance(digest, str) and len(digest) == 64 and all(ch in "0123456789abcdef" for ch in digest)):
            raise DeliveryRequestInvalid("an evidence digest is 64 lowercase hex characters")
    elif kind == "verification_proof":
        if proof.get("verified_count") != op.record_count or \
                proof.get("payload_sha256") != hashlib.sha256(bytes(op.payload)).hexdigest():
            raise DeliveryRequestInvalid("a verification proof repeats the record count and sealed payload digest")
    return hashlib.sha256(canonical_json(proof).encode()).digest()


def _apply(*, actor: Actor, operation_pk: int, reconciliation_id: str, target: str, proof: dict | None,
           note: str, opening: bool, expected_revision: int) -> DeliveryOperation:
    if isinstance(expected_revision, bool) or not isinstance(expected_revision, int):
        raise StateTokenInvalid(f"a reconciliation of operation #{operation_pk} carries the revision it was decided "
                                "on")
    if not reconciliation_id or reconciliation_id != reconciliation_id.strip():
        raise DeliveryRequestInvalid("a reconciliation ID is required (canonical, no surrounding whitespace)")
    c = contract()
    head = DeliveryOperation.objects.get(pk=operation_pk)
    with transaction.atomic():
        domain_lock_for_update(head.domain_id)
        parent = DeliveryParent.objects.select_for_update().get(pk=head.parent_id)
        op = operation_for_update(operation_pk)
        if op.revision != expected_revision:
            raise DeliveryRequestInvalid(f"operation #{op.pk} moved since the page was shown (now {op.state}, "
                                         f"revision {op.revision}); reload and decide again")
        rule = c.transition(op.state, target)
        if rule is None or not rule.operator_only:
            raise DeliveryRequestInvalid(f"{op.state} -> {target} is not an operator-only transition")
        if opening != target.startswith("reconciling_"):
            raise DeliveryRequestInvalid("open moves into reconciling_*, resolve moves out of it")
        if not opening and op.reconciliation_id != reconciliation_id:
            raise DeliveryRequestInvalid(f"the open reconciliation is {op.reconciliation_id!r}")
        method = f"reconcile_to_{target}"
        _require(actor, op, method)
        proof_digest = _check_proof(op, target, rule.proof, proof)
        source = op.state
        getattr(op, method)()
        op.revision += 1
        op.reconciliation_id = reconciliation_id
        if not opening and op.axis("remote_effect") != "UNKNOWN":
            op.reconciled = True
        op.save()
        try:
            with transaction.atomic():
                DeliveryReconciliation.objects.create(
                    operation=op, reconciliation_id=reconciliation_id, from_state=source, to_state=target,
                    revision=op.revision, proof_kind=rule.proof or "", proof=proof, proof_digest=proof_digest,
                    approved_by=actor.user, note=note)
        except IntegrityError as exc:
            raise DeliveryRequestInvalid("a concurrent reconciliation moved this operation first") from exc
        audit_record(actor=actor, entity=op, action="delivery_reconcile", from_state=source, to_state=target,
                     fence=op.revision, evidence_digest=proof_digest, reason=f"{reconciliation_id}: {note}")
        if not opening:
            if op.axis("remote_effect") != "UNKNOWN":
                finalization.release_all(op, "reconciliation")
            finalization.after_final(op, parent=parent)
    return op


def reconcile_open(*, actor: Actor, operation_pk: int, reconciliation_id: str, note: str = "",
                   expected_revision: int) -> DeliveryOperation:
    op = DeliveryOperation.objects.get(pk=operation_pk)
    targets = [t.target for t in contract().transitions if t.operator_only and t.source == op.state
               and t.target.startswith("reconciling_")]
    if not targets:
        raise DeliveryRequestInvalid(f"{op.state} has no reconciliation to open")
    return _apply(actor=actor, operation_pk=operation_pk, reconciliation_id=reconciliation_id, target=targets[0],
                  proof=None, note=note, opening=True, expected_revision=expected_revision)


def reconcile_resolve(*, actor: Actor, operation_pk: int, reconciliation_id: str, target: str, proof: dict,
                      expected_revision: int, note: str = "") -> DeliveryOperation:
    return _apply(actor=actor, operation_pk=operation_pk, reconciliation_id=reconciliation_id, target=target,
                  proof=proof, note=note, opening=False, expected_revision=expected_revision)


def capacity_transfer(*, actor: Actor, operation_pk: int, incident: str) -> DeliveryOperation:
    """Audited incident capacity transfer: an unknown or partial effect stops holding remote job capacity
    without being resolved (the operation stays as it is)."""
    if actor.user is None or not actor.user.has_perm(PERMISSION):
        raise DeliveryPermissionDenied(f"{actor} lacks {PERMISSION}")
    if not incident.strip():
        raise DeliveryRequestInvalid("a capacity transfer names its incident")
    with transaction.atomic():
        op = operation_for_update(operation_pk)
        finalization.release_all(op, f"incident:{incident}", transfer=True)
        audit_record(actor=actor, entity=op, action="delivery_capacity_transfer", reason=incident)
    return op
