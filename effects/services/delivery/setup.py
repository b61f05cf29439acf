"""Receiver bindings, secret rotation, certification (with dual approval for platform attestation), operation
profiles, remote job semaphores and the contract approval receipt. Each function is one transaction."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from connector.actors import Actor
from connector.errors import ApprovalReasonMissing, StateTokenInvalid
from connector.services.secrets import put_secret
from connector.services.audit import audit_record
from connector.services.identity import approver_require_independent
from effects.delivery import identity
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryPermissionDenied, DeliveryRequestInvalid
from effects.models import (
    CertificationApproval,
    DeliveryApprovalReceipt,
    DeliveryProfile,
    ReceiverBinding,
    ReceiverCertification,
    ReceiverSecretVersion,
    RemoteJobSemaphore,
)
from effects.choices import CertificationState


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _require_perm(actor: Actor, perm: str) -> None:
    if actor.user is None or not actor.user.has_perm(perm):
        raise DeliveryPermissionDenied(f"{actor} lacks permission {perm}")


# -- the contract approval receipt --------------------------------------------------------------------------------

def approval_record(*, actor: Actor, adr_digests: list[str], owner_approvals: list[str],
                    evidence_requirements: list[str]) -> DeliveryApprovalReceipt:
    """Record the separate approval receipt of the shipped contract (by digest). The contract file is never
    edited; a second approval of the same digest is refused."""
    _require_perm(actor, "effects.approve_journal_epoch")
    if not adr_digests or not owner_approvals or not evidence_requirements:
        raise DeliveryRequestInvalid("an approval receipt references ADR digests, owner approvals and evidence")
    with transaction.atomic():
        try:
            with transaction.atomic():
                receipt = DeliveryApprovalReceipt.objects.create(
                    contract_digest=contract().digest, adr_digests=adr_digests, owner_approvals=owner_approvals,
                    evidence_requirements=evidence_requirements, approved_by=actor.user)
        except IntegrityError as exc:
            raise DeliveryRequestInvalid("this contract digest already has its approval receipt") from exc
        audit_record(actor=actor, entity=receipt, action="delivery_contract_approve", reason=contract().digest)
    return receipt


def contract_approved() -> bool:
    return DeliveryApprovalReceipt.objects.filter(contract_digest=contract().digest).exists()


# -- receiver bindings ----------------------------------------------------------------------------------------

BINDING_FIELDS = tuple(contract().raw["receiver_binding"]["stable_non_secret_identity_fields"])
SUPPORTED_AUTH = tuple(contract().raw["receiver_binding"]["authentication"]["supported"])
API_KEY_QUERY_EXCEPTION = tuple(contract().raw["receiver_binding"]["authentication"]["api_key_query"]
                                ["exception_requires"])


def binding_semantics_digest(fields: dict) -> bytes:
    return identity.receiver_binding_semantics(**{f: fields[f] for f in BINDING_FIELDS})


def binding_create(*, actor: Actor, name: str, base_url: str, authentication_mode: str, secret: bytes,
                   api_key_query_exception: dict | None = None, **identity_fields: str) -> ReceiverBinding:
    """A new binding with its first secret version. `identity_fields` are exactly the contract's stable
    non-secret identity fields except `authentication_semantics`, which is derived from the mode and its
    non-secret parameters (e.g. the header name)."""
    if authentication_mode == "api_key_query":
        missing = [r for r in API_KEY_QUERY_EXCEPTION if not (api_key_query_exception or {}).get(r)]
        if missing:
            raise DeliveryRequestInvalid(f"api_key_query is forbidden in production; the exception needs every "
                                         f"requirement recorded, missing: {', '.join(missing)}")
    elif authentication_mode not in SUPPORTED_AUTH:
        raise DeliveryRequestInvalid(f"authentication mode {authentication_mode!r} is not supported")
    fields = dict(identity_fields)
    fields.setdefault("authentication_semantics", authentication_mode)
    if set(fields) != set(BINDING_FIELDS):
        raise DeliveryRequestInvalid(f"binding identity needs exactly {', '.join(BINDING_FIELDS)}")
    digest = binding_semantics_digest(fields)
    with transaction.atomic():
        try:
            with transaction.atomic():
                binding = ReceiverBinding.objects.create(
                    name=name, base_url=base_url, authentication_mode=authentication_mode,
                    api_key_query_exception=api_key_query_exception, semantics_digest=digest, **fields)
        except IntegrityError as exc:
            raise DeliveryRequestInvalid(f"a binding named {name!r} or with these semantics exists") from exc
        ref = put_secret(f"delivery-{name}", secret)
        ReceiverSecretVersion.objects.create(binding=binding, version=1, secret_version_ref=ref)
        audit_record(actor=actor, entity=binding, action="delivery_binding_create", evidence_digest=digest)
    return binding


def secret_rotate(*, actor: Actor, binding: ReceiverBinding, secret: bytes) -> ReceiverSecretVersion:
    """A new secret version; the binding's identity (and every mutation intent) stays as it was."""
    with transaction.atomic():
        ReceiverBinding.objects.select_for_update().get(pk=binding.pk)
        latest = binding.secret_versions.aggregate(m=Max("version"))["m"] or 0
        ref = put_secret(f"delivery-{binding.name}", secret)
        version = ReceiverSecretVersion.objects.create(binding=binding, version=latest + 1, secret_version_ref=ref)
        audit_record(actor=actor, entity=binding, action="delivery_secret_rotate", reason=f"v{latest + 1}")
    return version


def current_secret_ref(binding: ReceiverBinding) -> str:
    return binding.secret_versions.order_by("-version").values_list("secret_version_ref", flat=True).first()


# -- certification --------------------------------------------------------------------------------------------

def certification_request(*, actor: Actor, binding: ReceiverBinding, assurance_mode: str, handshake: dict,
                          evidence_ref: str, valid_until: datetime) -> ReceiverCertification:
    """Certify from the connection handshake: the handshake's principal and account must equal the binding's
    (else the remote identity is not the certified one). receiver_attested certifies at once; platform_attested
    waits for two distinct approvers."""
    allowed = contract().raw["receiver_binding"]["remote_identity"]["allowed_assurance_modes"]
    if assurance_mode not in allowed:
        raise DeliveryRequestInvalid(f"assurance mode {assurance_mode!r} is not one of {allowed}")
    if handshake.get("principal_id") != binding.remote_principal_id or \
            handshake.get("account_id") != binding.remote_account_id:
        raise DeliveryRequestInvalid("the handshake's remote principal/account is not the binding's")
    now = timezone.now()
    if valid_until <= now:
        raise DeliveryRequestInvalid("valid_until is in the past")
    evidence = {"handshake": handshake, "evidence_ref": evidence_ref}
    with transaction.atomic():
        if assurance_mode == "platform_attested":
            # A new subject for this binding replaces a pending one: its approvals are void with it.
            for stale in ReceiverCertification.objects.select_for_update().filter(
                    binding=binding, assurance_mode="platform_attested", state=CertificationState.PENDING_APPROVAL):
                stale.expire()
                stale.save()
                audit_record(actor=actor, entity=stale, action="delivery_certification_void",
                             to_state=stale.state, reason="superseded by a new platform attestation request")
        cert = ReceiverCertification.objects.create(
            binding=binding, assurance_mode=assurance_mode, principal_id=handshake["principal_id"],
            account_id=handshake["account_id"], evidence_ref=evidence_ref, evidence=evidence,
            evidence_digest=hashlib.sha256(canonical_json(evidence).encode()).digest(), verified_at=now,
            valid_until=valid_until, requested_by=actor.user)
        if assurance_mode == "receiver_attested":
            cert.certify(at=now)
            cert.save()
        audit_record(actor=actor, entity=cert, action="delivery_certification_request", to_state=cert.state,
                     evidence_digest=bytes(cert.evidence_digest))
    return cert


def certification_subject_digest(cert: ReceiverCertification) -> bytes:
    """What an approver approves: the binding's identity, the handshake evidence and the validity window."""
    return hashlib.sha256(b"|".join([bytes(cert.binding.semantics_digest), bytes(cert.evidence_digest),
                                     cert.assurance_mode.encode(), cert.verified_at.isoformat().encode(),
                                     cert.valid_until.isoformat().encode()])).digest()


def certification_approve(*, actor: Actor, certification: ReceiverCertification,
                          digest_seen: bytes) -> ReceiverCertification:
    """One approval of a platform-attested certification, recording the subject digest the approver saw. The
    requester cannot approve; one person approves once; the second distinct approver certifies. An approval of
    a digest that is no longer the subject's (the subject changed or was superseded) is refused and counts for
    nothing. `digest_seen` (the state token) is required: a missing or malformed one is refused with
    STATE_TOKEN_INVALID. Two approvals count only from independent people (connector.services.identity)."""
    if not isinstance(digest_seen, (bytes, bytearray, memoryview)) or len(bytes(digest_seen)) != 32:
        raise StateTokenInvalid("an approval carries the 32-byte subject digest the approver was shown")
    _require_perm(actor, "effects.approve_certification")
    with transaction.atomic():
        cert = ReceiverCertification.objects.select_for_update().get(pk=certification.pk)
        current = certification_subject_digest(cert)
        if bytes(digest_seen) != current:
            raise DeliveryRequestInvalid("the subject changed since it was shown: approvals of the old digest are "
                                         "void; review the current subject")
        if cert.state != CertificationState.PENDING_APPROVAL:
            raise DeliveryRequestInvalid(f"certification is {cert.state}")
        if cert.requested_by_id == actor.user.pk:
            raise DeliveryPermissionDenied("the requester cannot approve their own certification")
        approver_require_independent(approver_id=actor.user.pk, requester_id=cert.requested_by_id,
                                     other_approver_ids=list(cert.approvals.filter(digest_seen=current)
                                                             .exclude(approver_id=actor.user.pk)
                                                             .values_list("approver_id", flat=True)))
        try:
            with transaction.atomic():
                CertificationApproval.objects.create(certification=cert, approver=actor.user, digest_seen=current)
        except IntegrityError as exc:
            raise DeliveryPermissionDenied(f"{actor} already approved this certification") from exc
        if cert.approvals.filter(digest_seen=current).count() >= 2:
            cert.certify(at=timezone.now())
            cert.save()
        audit_record(actor=actor, entity=cert, action="delivery_certification_approve", to_state=cert.state)
    return cert


def certification_refuse(*, actor: Actor, certification: ReceiverCertification, digest_seen: bytes,
                         reason: str) -> ReceiverCertification:
    """Refuse a platform-attested certification waiting for approval (`pending_approval -> refused`, terminal,
    D-464): an approver other than the requester, with a reason, about the subject digest the page showed. The
    binding stays uncertified by it; a new certification request starts again. No independence check: a refusal
    only stops. Raises StateTokenInvalid, ApprovalReasonMissing, DeliveryRequestInvalid or
    DeliveryPermissionDenied."""
    if not isinstance(digest_seen, (bytes, bytearray, memoryview)) or len(bytes(digest_seen)) != 32:
        raise StateTokenInvalid("a refusal carries the 32-byte subject digest the approver was shown")
    _require_perm(actor, "effects.approve_certification")
    if not reason.strip():
        raise ApprovalReasonMissing("a refusal needs the refuser's reason")
    with transaction.atomic():
        cert = ReceiverCertification.objects.select_for_update().get(pk=certification.pk)
        if cert.state != CertificationState.PENDING_APPROVAL:
            raise DeliveryRequestInvalid(f"certification is {cert.state}; nothing to refuse")
        if bytes(digest_seen) != certification_subject_digest(cert):
            raise DeliveryRequestInvalid("the subject changed since it was shown; review the current subject")
        if cert.requested_by_id == actor.user.pk:
            raise DeliveryPermissionDenied("the requester cannot refuse their own certification")
        cert.refuse(by=actor.user, reason=reason.strip())
        cert.save()
        audit_record(actor=actor, entity=cert, action="delivery_certification_refuse",
                     from_state=CertificationState.PENDING_APPROVAL, to_state=cert.state, reason=reason.strip())
    return cert


def certification_expire_due(*, now: datetime | None = None) -> int:
    """Periodic recertification: certifications past valid_until become expired (deliveries then refuse)."""
    now = now or timezone.now()
    expired = 0
    open_states = (CertificationState.PENDING_APPROVAL, CertificationState.CERTIFIED)  # refused stays refused
    for pk in ReceiverCertification.objects.filter(valid_until__lte=now, state__in=open_states).values_list(
            "pk", flat=True):
        with transaction.atomic():
            cert = ReceiverCertification.objects.select_for_update().get(pk=pk)
            if cert.state in open_states and cert.valid_until <= now:
                cert.expire()
                cert.save()
                audit_record(actor=Actor.system("recertification"), entity=cert,
                             action="delivery_certification_expire", to_state=cert.state)
                expired += 1
    return expired


def binding_certified(binding: ReceiverBinding, *, at: datetime | None = None) -> ReceiverCertification | None:
    at = at or timezone.now()
    return (binding.certifications.filter(state=CertificationState.CERTIFIED, verified_at__lte=at,
                                          valid_until__gt=at, principal_id=binding.remote_principal_id)
            .order_by("-valid_until").first())


# -- profiles and semaphores ------------------------------------------------------------------------------------

OPERATION_FIELDS = identity.identity_fields("operation_semantics_digest")
POLICY_FIELDS = identity.identity_fields("execution_policy_digest")


def _text_fields(values: dict, names: tuple[str, ...], what: str) -> dict:
    if set(values) != set(names):
        raise DeliveryRequestInvalid(f"{what} needs exactly {', '.join(names)}")
    return {k: values[k] if isinstance(values[k], str) else canonical_json(values[k]) for k in names}


def profile_create(*, actor: Actor, name: str, receiver_kind: str, mutation_policy: str, scope_kind: str,
                   operation_semantics: dict, execution_policy: dict, profile_schema_id: str, profile_version: int,
                   max_records_per_child: int, append_exception: dict | None = None) -> DeliveryProfile:
    op_digest = identity.operation_semantics(**_text_fields(operation_semantics, OPERATION_FIELDS,
                                                            "operation semantics"))
    policy_digest = identity.execution_policy(**_text_fields(execution_policy, POLICY_FIELDS, "execution policy"))
    if append_exception is not None:
        needed = contract().raw["mutation_policies"]["incremental_append"]["exception_requires"]
        missing = [r for r in needed if not append_exception.get(r)]
        if missing:
            raise DeliveryRequestInvalid(f"the append exception needs every requirement: missing {missing}")
    with transaction.atomic():
        try:
            with transaction.atomic():
                profile = DeliveryProfile.objects.create(
                    name=name, receiver_kind=receiver_kind, mutation_policy=mutation_policy, scope_kind=scope_kind,
                    operation_semantics=operation_semantics, execution_policy=execution_policy,
                    append_exception=append_exception, profile_schema_id=profile_schema_id,
                    profile_version=profile_version, max_records_per_child=max_records_per_child,
                    operation_semantics_digest=op_digest, execution_policy_digest=policy_digest,
                    profile_contract_digest=identity.profile_contract(
                        operation_semantics_digest=op_digest, execution_policy_digest=policy_digest,
                        profile_schema_id=profile_schema_id, profile_version=profile_version))
        except IntegrityError as exc:
            raise DeliveryRequestInvalid(f"profile {name!r} (or one with the same contract digest) exists") from exc
        audit_record(actor=actor, entity=profile, action="delivery_profile_create",
                     evidence_digest=bytes(profile.profile_contract_digest))
    return profile


def semaphore_ensure(*, remote_principal_id: str, profile: DeliveryProfile) -> RemoteJobSemaphore:
    capacity = int(profile.policy("concurrency_policy", {}).get("remote_job_capacity", 1))
    semaphore, _ = RemoteJobSemaphore.objects.get_or_create(remote_principal_id=remote_principal_id,
                                                            profile=profile, defaults={"capacity": capacity})
    return semaphore
