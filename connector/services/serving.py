"""ServingEpoch lifecycle: prepare, verify (fresh owner reads, then a compare-and-swap), reject, and the atomic
first activation transaction that cutover coordinators wrap with barriers and the CutoverDecision."""
from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django_fsm import can_proceed

from connector import locks
from connector.actors import Actor
from connector.canonical.decoding import decode
from connector.canonical.profiles import (
    EPOCH_AUTHORING_PROFILE_ID,
    DigestProfileError,
    authoring_profile,
    profile_for,
)
from connector.choices import EpochState
from connector.errors import (
    ActivationCardinalityExceeded,
    EpochCandidateInvalid,
    EpochNotFound,
    EpochRetentionUnmet,
    FenceStale,
    OwnerFactInvalid,
    OwnerUnavailable,
    PermissionRefused,
    TransitionRefused,
)
from connector.models import (
    AccountServingGate,
    BindingDefinition,
    CatalogBinding,
    CredentialGeneration,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationGeneration,
    ServingEpoch,
    ServingEpochBindingProof,
    ServingEpochCredentialProof,
)
from connector.selectors.epoch_candidate import EpochCandidate, candidate_from_owners, epoch_preimage
from connector.selectors.serving import epoch_retention_blockers
from connector.services.audit import audit_record
from connector.services.gates import fsm_edge, gates_bind_epoch
from connector.services.owners import ident

log = logging.getLogger(__name__)
# An epoch transition writes only these columns (never the possibly large, immutable preimage back).
EPOCH_STATE_FIELDS = ["state", "state_changed_at", "rejection_code", "rejection_detail"]
DEFAULT_ACTIVATION_MAX_ACCOUNTS = 100_000


def _same(a, b) -> bool:
    return a is not None and b is not None and hmac.compare_digest(bytes(a), bytes(b))


def _require_perm(actor: Actor, perm: str) -> None:
    """People need the permission; system actors (coordinators, the sweeper) act under their own authority."""
    if actor.user is not None and not actor.user.has_perm(perm):
        raise PermissionRefused(f"{actor} lacks {perm}")


# -- prepare --------------------------------------------------------------------------------------------------

def _check_structure(candidate: EpochCandidate) -> None:
    try:
        authoring_profile(candidate.profile_id)
    except DigestProfileError as exc:
        raise EpochCandidateInvalid(f"{exc.code}: {exc}", reason=exc.code) from exc
    if candidate.profile_id != EPOCH_AUTHORING_PROFILE_ID:
        raise EpochCandidateInvalid(f"profile {candidate.profile_id} authors other digests, not ServingEpochs; "
                                    f"only {EPOCH_AUTHORING_PROFILE_ID} authors epoch candidates")
    labels = {p.profile_id for p in (*candidate.bindings, *candidate.credentials)}
    if labels - {candidate.profile_id}:
        raise EpochCandidateInvalid(f"mixed-profile graph: proofs labelled {sorted(map(str, labels))}, header "
                                    f"{candidate.profile_id}")
    if not candidate.bindings:
        raise EpochCandidateInvalid("a candidate binds at least one Catalog binding")
    if [b.ordinal for b in candidate.bindings] != list(range(len(candidate.bindings))):
        raise EpochCandidateInvalid("binding ordinals must be dense from 0 in Catalog order")
    if [p.ordinal for p in candidate.credentials] != list(range(len(candidate.credentials))):
        raise EpochCandidateInvalid("credential proof ordinals must be dense from 0")
    ids = [p.generation_id.encode("utf-8") for p in candidate.credentials]
    if len(set(ids)) != len(ids):
        raise EpochCandidateInvalid("credential proofs repeat a generation")
    if ids != sorted(ids):
        raise EpochCandidateInvalid("credential proofs must be in ascending generation-ID byte order")


@transaction.atomic
def epoch_prepare(*, candidate: EpochCandidate, actor: Actor) -> ServingEpoch:
    """Store a V2-profiled candidate as a `prepared` ServingEpoch with its frozen proof rows.

    Refuses (writing nothing) a non-authoring or unknown profile, a mixed-profile graph, broken ordinals, and
    references to generations that do not exist exactly. Re-preparing identical bytes returns the existing
    epoch. Preparation proves nothing about the owners: only `epoch_verify` can."""
    ident(candidate.epoch_id, "epoch_id")
    _check_structure(candidate)
    preimage = epoch_preimage(candidate)
    digest = hashlib.sha256(preimage).digest()
    existing = ServingEpoch.objects.filter(epoch_id=candidate.epoch_id).first()
    if existing is not None:
        if _same(existing.digest, digest):
            return existing
        raise EpochCandidateInvalid(f"epoch {candidate.epoch_id} exists with different bytes; mint a new epoch ID")
    c = candidate.catalog
    view = IntegrationBindingView.objects.filter(view_key=c.view_key, revision=c.revision).first()
    config = ServiceConfigurationGeneration.objects.filter(generation_id=candidate.configuration.generation_id).first()
    if view is None or config is None:
        raise EpochCandidateInvalid("the candidate names a Catalog view or configuration generation that does not "
                                    "exist exactly")
    bindings = {b.ordinal: b for b in CatalogBinding.objects.filter(view=view)}
    packs = {p.generation_id: p for p in PackGeneration.objects.filter(
        generation_id__in=[b.pack_generation_id for b in candidate.bindings])}
    credentials = {g.generation_id: g for g in CredentialGeneration.objects.filter(
        generation_id__in=[p.generation_id for p in candidate.credentials])}
    missing = ([f"binding #{b.ordinal}" for b in candidate.bindings if b.ordinal not in bindings]
               + [f"pack generation {b.pack_generation_id}" for b in candidate.bindings
                  if b.pack_generation_id not in packs]
               + [f"credential generation {p.generation_id}" for p in candidate.credentials
                  if p.generation_id not in credentials])
    if missing:
        raise EpochCandidateInvalid(f"not exact generations: {', '.join(missing)}")
    try:
        epoch = ServingEpoch.objects.create(
            epoch_id=candidate.epoch_id, profile_id=candidate.profile_id,
            serving_scope_digest=candidate.serving_scope_digest, catalog_view=view, configuration=config,
            configuration_receipt=candidate.configuration.owner_receipt,
            configuration_receipt_digest=candidate.configuration.owner_receipt_digest,
            preimage=preimage, digest=digest)
    except IntegrityError as exc:
        raise EpochCandidateInvalid(f"epoch refused by the database: {exc.__cause__}") from exc
    definitions = {(d.pack_generation_id, d.kind, d.business_key, d.definition_version): d
                   for d in BindingDefinition.objects.filter(pack_generation__in=packs.values())}
    missing = [f"{b.kind} {b.business_key} v{b.definition_version}" for b in candidate.bindings
               if (packs[b.pack_generation_id].pk, b.kind, b.business_key, b.definition_version) not in definitions]
    if missing:
        raise EpochCandidateInvalid(f"no exact binding definition for: {', '.join(missing)}")
    ServingEpochBindingProof.objects.bulk_create([ServingEpochBindingProof(
        epoch=epoch, ordinal=b.ordinal, binding=bindings[b.ordinal], pack_generation=packs[b.pack_generation_id],
        definition=definitions[(packs[b.pack_generation_id].pk, b.kind, b.business_key, b.definition_version)],
        canonical_definition_digest=b.canonical_definition_digest, owner_receipt=b.owner_receipt,
        owner_receipt_digest=b.owner_receipt_digest) for b in candidate.bindings])
    ServingEpochCredentialProof.objects.bulk_create([ServingEpochCredentialProof(
        epoch=epoch, ordinal=p.ordinal, credential_generation=credentials[p.generation_id],
        owner_receipt=p.owner_receipt, owner_receipt_digest=p.owner_receipt_digest) for p in candidate.credentials])
    audit_record(actor=actor, entity=epoch, action="epoch_prepare", to_state=epoch.state, evidence_digest=digest)
    return epoch


def epoch_prepare_from_owners(*, epoch_id: str, configuration_generation_id: str, actor: Actor) -> ServingEpoch:
    """Prepare a candidate built from fresh exact owner reads (the L2 authoring path)."""
    candidate = candidate_from_owners(epoch_id=epoch_id, configuration_generation_id=configuration_generation_id)
    return epoch_prepare(candidate=candidate, actor=actor)


# -- verify ---------------------------------------------------------------------------------------------------

def _first_difference(stored: bytes, fresh: bytes) -> str:
    try:
        _, a = decode(stored)
        _, b = decode(fresh)
        for (name, left), (_, right) in zip(a, b):
            if left != right:
                return name
    except Exception:  # a preimage that does not decode differs everywhere
        return "preimage"
    return "preimage"


def _verification_outcome(epoch: ServingEpoch) -> tuple[str, str] | None:
    """None when every prepared field byte-equals the fresh owner reads; else (reason code, detail). Raises
    OwnerUnavailable for retryable unavailability (the candidate then stays `prepared`)."""
    try:
        profile = profile_for(epoch.profile_id)
    except DigestProfileError as exc:
        return exc.code, str(exc)
    if not profile.authoring or profile.profile_id != EPOCH_AUTHORING_PROFILE_ID:
        return "EPOCH_PROFILE_NOT_AUTHORING", (f"profile {epoch.profile_id or 'legacy unprofiled'} is read-only; "
                                               "the candidate is inert and must be replaced")
    if epoch.configuration_id is None or epoch.catalog_view_id is None:
        return "EPOCH_REPRODUCIBILITY_HEADER_MISSING", "the candidate lacks its configuration or Catalog reference"
    if not _same(hashlib.sha256(bytes(epoch.preimage)).digest(), epoch.digest):
        return "EPOCH_DIGEST_MISMATCH", "stored digest is not the digest of the stored preimage"
    try:
        fresh = candidate_from_owners(epoch_id=epoch.epoch_id,
                                      configuration_generation_id=epoch.configuration.generation_id,
                                      profile_id=epoch.profile_id)
    except OwnerFactInvalid as exc:
        return "OWNER_FACT_INVALID", exc.detail
    fresh_preimage = epoch_preimage(fresh)
    if not _same(fresh_preimage, epoch.preimage):
        return "EPOCH_OWNER_MISMATCH", (f"prepared {_first_difference(bytes(epoch.preimage), fresh_preimage)} "
                                        "differs from the owners' exact generations")
    if (epoch.catalog_view.view_key, epoch.catalog_view.revision) != (fresh.catalog.view_key, fresh.catalog.revision):
        return "EPOCH_OWNER_MISMATCH", "prepared Catalog view reference differs from the current view"
    rows = list(epoch.binding_proofs.select_related("binding", "pack_generation").order_by("ordinal"))
    if [(r.binding.row_id, r.pack_generation.generation_id, bytes(r.owner_receipt)) for r in rows] != [
            (b.row_id, b.pack_generation_id, b.owner_receipt) for b in fresh.bindings]:
        return "EPOCH_OWNER_MISMATCH", "frozen binding proof rows differ from the owners"
    # two per account: the compared columns only, as tuples (issue 19, D-207, D-272)
    with connection.cursor() as cursor:
        cursor.execute(CREDENTIAL_PROOF_ROWS_SQL, [epoch.pk])
        crows = cursor.fetchall()
    if len(crows) != len(fresh.credentials) or any(
            generation_id != p.generation_id or bytes(receipt) != p.owner_receipt
            for (generation_id, receipt), p in zip(crows, fresh.credentials)):
        return "EPOCH_OWNER_MISMATCH", "frozen credential proof rows differ from the owners"
    return None


CREDENTIAL_PROOF_ROWS_SQL = """
SELECT g.generation_id, p.owner_receipt
  FROM connector_servingepochcredentialproof AS p
  JOIN connector_credentialgeneration AS g ON g.id = p.credential_generation_id
 WHERE p.epoch_id = %s
 ORDER BY p.ordinal
"""


def epoch_owner_drift(*, epoch_pk: int) -> tuple[str, str] | None:
    """Reread every owner of an epoch (no transaction, no write): None when every frozen byte still equals the
    owners' exact generations, else (reason code, detail). Used by successor coordinators under held barriers
    (CV2-11-013). Raises EpochNotFound, or OwnerUnavailable for retryable unavailability."""
    epoch = ServingEpoch.objects.select_related("configuration", "catalog_view").filter(pk=epoch_pk).first()
    if epoch is None:
        raise EpochNotFound()
    return _verification_outcome(epoch)


def epoch_verify(*, epoch_pk: int, actor: Actor) -> ServingEpoch:
    """`prepared -> verified | rejected` by fresh reads of every owner, never from caller-supplied receipts.

    The reads happen before the transaction; the transaction locks the epoch (FOR UPDATE) and compare-and-swaps
    the unchanged prepared candidate. Retryable owner unavailability raises OwnerUnavailable and leaves the
    epoch `prepared`; authoritative absence or mismatch rejects it with a reason code (CV2-02-035..038)."""
    epoch = ServingEpoch.objects.select_related("configuration", "catalog_view").filter(pk=epoch_pk).first()
    if epoch is None:
        raise EpochNotFound()
    if epoch.state != EpochState.PREPARED:
        raise TransitionRefused(f"epoch {epoch.epoch_id} is {epoch.state}, not prepared")
    _require_perm(actor, "connector.verify_servingepoch")
    observed = bytes(epoch.digest)
    try:
        outcome = _verification_outcome(epoch)
    except OwnerUnavailable:
        log.warning("epoch verification deferred: owner unavailable", extra={"epoch": epoch.epoch_id})
        raise
    with transaction.atomic():
        locked = locks.epoch_for_update(epoch_pk)
        if locked.state != EpochState.PREPARED or not _same(locked.digest, observed):
            raise FenceStale(f"epoch {locked.epoch_id} changed during verification; nothing was written")
        if outcome is None:
            locked.verify()
        else:
            locked.reject(code=outcome[0], detail=outcome[1])
        locked.save(update_fields=EPOCH_STATE_FIELDS)
        audit_record(actor=actor, entity=locked, action="epoch_verify", from_state=EpochState.PREPARED,
                     to_state=locked.state, evidence_digest=observed,
                     reason="" if outcome is None else f"{outcome[0]}: {outcome[1]}")
    return locked


@transaction.atomic
def epoch_reject(*, epoch_pk: int, reason: str, actor: Actor) -> ServingEpoch:
    """An explicit, audited operator decision rejecting an abandoned `prepared` or `verified` candidate
    (decision 10). Active epochs are never rejected."""
    epoch = locks.epoch_for_update(epoch_pk)
    if not can_proceed(epoch.reject):
        raise TransitionRefused(f"epoch {epoch.epoch_id} is {epoch.state}; only prepared or verified epochs can be "
                                "rejected")
    if not reason.strip():
        raise TransitionRefused("a rejection needs a reason")
    _require_perm(actor, "connector.reject_servingepoch")
    from_state = epoch.state
    epoch.reject(code="OPERATOR_REJECTED", detail=reason)
    epoch.save(update_fields=EPOCH_STATE_FIELDS)
    audit_record(actor=actor, entity=epoch, action="epoch_reject", from_state=from_state, to_state=epoch.state,
                 evidence_digest=bytes(epoch.digest), reason=reason)
    return epoch


# -- activation -----------------------------------------------------------------------------------------------

def epoch_activate_first(*, epoch_pk: int, actor: Actor) -> ServingEpoch:
    """The atomic first activation: reread every owner, then in one transaction lock the epoch (FOR UPDATE),
    then every gate of the configuration's exhaustive account set in account order (FOR UPDATE), require the
    epoch still `verified` with the same digest and every gate `v2_validating`, and move the epoch
    `verified -> active` and every gate to `v2_serving` naming it (new fence each). Retryable unavailability
    refuses and leaves the epoch `verified`; authoritative mismatch rejects it (CV2-02-039/040)."""
    epoch = ServingEpoch.objects.select_related("configuration", "catalog_view").filter(pk=epoch_pk).first()
    if epoch is None:
        raise EpochNotFound()
    if epoch.state != EpochState.VERIFIED:
        raise TransitionRefused(f"epoch {epoch.epoch_id} is {epoch.state}; only a verified epoch activates")
    _require_perm(actor, "connector.activate_servingepoch")
    if epoch.configuration_id is not None:  # else the reread below rejects it (reproducibility header missing)
        activation_cardinality_check(accounts=epoch.configuration.accounts.count())
    observed = bytes(epoch.digest)
    outcome = _verification_outcome(epoch)  # OwnerUnavailable propagates: stays verified
    account_ids = list(epoch.configuration.accounts.values_list("account_id", flat=True))
    with transaction.atomic():
        locked = locks.epoch_for_update(epoch_pk)
        if locked.state != EpochState.VERIFIED or not _same(locked.digest, observed):
            raise FenceStale(f"epoch {locked.epoch_id} changed during activation; nothing was written")
        if outcome is not None:
            locked.reject(code=outcome[0], detail=outcome[1])
            locked.save(update_fields=EPOCH_STATE_FIELDS)
            audit_record(actor=actor, entity=locked, action="epoch_activate_first", from_state=EpochState.VERIFIED,
                         to_state=locked.state, evidence_digest=observed, reason=f"{outcome[0]}: {outcome[1]}")
            return locked
        activate_first_locked(epoch=locked, account_ids=account_ids, actor=actor, observed=observed)
    return locked


def activation_cardinality_check(*, accounts: int) -> None:
    """Refuse a whole-service activation over more accounts than the declared maximum
    (CONNECTOR["ACTIVATION_MAX_ACCOUNTS"], D-210). Coordinators call it before any barrier closes or anything is
    written; the activation transactions call it again before their first lock."""
    limit = int(settings.CONNECTOR.get("ACTIVATION_MAX_ACCOUNTS", DEFAULT_ACTIVATION_MAX_ACCOUNTS))
    if accounts > limit:
        raise ActivationCardinalityExceeded(f"the activation names {accounts} accounts; the declared maximum is "
                                            f"{limit} (CONNECTOR_ACTIVATION_MAX_ACCOUNTS)")


def activate_first_locked(*, epoch: ServingEpoch, account_ids: list[int], actor: Actor, observed: bytes,
                          gates: list[locks.GateRow] | None = None, hold_provider_io: bool = False) -> None:
    """Inside the caller's transaction, with the epoch already locked FOR UPDATE and checked `verified` with the
    observed digest: lock every gate of the exhaustive account set (ascending account id), require each
    `v2_validating`, and move the epoch `verified -> active` and every gate to `v2_serving` naming it (new fence
    each). The first activation of a service cutover (cutover.services.first_activation) runs this same body
    inside its barrier-set transaction; it passes `gates` it already holds (locks.gates_for_update of exactly
    `account_ids`, after the set and the epoch) when it has read them for its evidence.

    Set-based (D-210, D-278, D-279): the gates are locked by one SELECT ... FOR UPDATE read as tuples, and move
    with their audit rows in one statement (gates.gates_bind_epoch), so the statement count does not grow with
    the account set. `hold_provider_io` (a service cutover's first activation): the epoch is also marked
    `provider_io_held` in this transaction, so no permit is granted on it until `epoch_enable_provider_io` has
    read the activation back (CV2-12-071, D-321). Raises
    ActivationCardinalityExceeded above the declared maximum and TransitionRefused for a missing or unready gate;
    the caller's transaction then rolls back."""
    activation_cardinality_check(accounts=len(account_ids))
    if gates is None:  # else the caller locked them already, in this transaction, in the canonical order
        gates = locks.gates_for_update(account_ids)
    if [g.account_id for g in gates] != sorted(set(account_ids)) or len(gates) != len(account_ids):
        raise TransitionRefused("an account of the configuration has no serving gate")
    source, _ = fsm_edge(AccountServingGate.activate_first)
    not_ready = [g for g in gates if g.mode != source]
    if not_ready:
        raise TransitionRefused(f"every gate must be {source}; not ready: "
                                + ", ".join(f"{g.account_id}={g.mode}" for g in not_ready[:10]))
    epoch.activate()
    epoch.provider_io_held = hold_provider_io
    epoch.save(update_fields=[*EPOCH_STATE_FIELDS, "provider_io_held"] if hold_provider_io else EPOCH_STATE_FIELDS)
    audit_record(actor=actor, entity=epoch, action="epoch_activate_first", from_state=EpochState.VERIFIED,
                 to_state=EpochState.ACTIVE, evidence_digest=observed,
                 reason="provider I/O held until the activation readback" if hold_provider_io else "")
    gates_bind_epoch(gates=gates, action="activate_first", epoch=epoch, actor=actor, evidence_digest=observed)


def epoch_enable_provider_io(*, epoch_pk: int, readback: Callable[[ServingEpoch], bool], actor: Actor) -> bool:
    """The exact activation readback's transaction (CV2-12-071, D-321): lock the epoch FOR UPDATE (every permit
    acquisition holds it FOR SHARE through its guard, so they serialize), run the caller's exact `readback` of
    the activation under that lock and, only if it holds, clear `provider_io_held`. Returns whether the readback
    held; False writes nothing. An epoch already enabled is read back again and left as it is (the resume)."""
    with transaction.atomic():
        epoch = locks.epoch_for_update(epoch_pk)
        if epoch.state != EpochState.ACTIVE or not readback(epoch):
            return False
        if epoch.provider_io_held:
            epoch.provider_io_held = False
            epoch.save(update_fields=["provider_io_held"])
            audit_record(actor=actor, entity=epoch, action="epoch_enable_provider_io", from_state=epoch.state,
                         to_state=epoch.state, evidence_digest=bytes(epoch.digest),
                         reason="exact activation readback: provider I/O enabled")
    return True


# -- retirement -----------------------------------------------------------------------------------------------

@transaction.atomic
def epoch_retire(*, epoch_pk: int, actor: Actor, reason: str, expected_digest: bytes | None = None) -> ServingEpoch:
    """`draining -> retired`, an explicit, audited operator decision taken only once every fact that names the
    epoch is terminal (D-267; CV2-02-033, CV2-11-026).

    One transaction: the epoch FOR UPDATE (canonical rank 2; nothing else is locked), then, under that lock, the
    exact epoch (`expected_digest`, when given, else FENCE_STALE), state `draining` (else TRANSITION_REFUSED), a
    reason and the retire permission, and the retention rule (`selectors.serving.epoch_retention_blockers`):
    any blocker refuses with EPOCH_RETENTION_UNMET naming each code and its rows. Guarded writes need an `active`
    epoch, so none can add work to a draining one; the facts that still move (effects, results) only move toward
    terminal, so a clear read under the lock stays clear. Retiring deletes and rewrites nothing but the state
    columns: every fact of the epoch stays readable (CV2-02-013). Nothing calls it on a timer (CV2-13-005)."""
    epoch = locks.epoch_for_update(epoch_pk)
    if expected_digest is not None and not _same(epoch.digest, expected_digest):
        raise FenceStale(f"epoch {epoch.epoch_id} is not the exact epoch the caller read")
    if not can_proceed(epoch.retire):
        raise TransitionRefused(f"epoch {epoch.epoch_id} is {epoch.state}; only a draining epoch retires")
    if not reason.strip():
        raise TransitionRefused("a retirement needs a reason")
    _require_perm(actor, "connector.retire_servingepoch")
    blockers = epoch_retention_blockers(epoch)
    if blockers:
        raise EpochRetentionUnmet(f"epoch {epoch.epoch_id} still has open facts: "
                                  + "; ".join(f"{code}: {detail}" for code, detail in blockers), blockers=blockers)
    epoch.retire()
    epoch.save(update_fields=EPOCH_STATE_FIELDS)
    audit_record(actor=actor, entity=epoch, action="epoch_retire", from_state=EpochState.DRAINING,
                 to_state=epoch.state, evidence_digest=bytes(epoch.digest), reason=reason)
    return epoch


def epochs_hand_over(*, predecessor: ServingEpoch, successor: ServingEpoch, actor: Actor) -> None:
    """A successor activation's epoch moves (D-551): `predecessor` active -> draining, then `successor` verified ->
    active, each saved and audited, in the CALLER's transaction after it locked both epochs and checked the
    succession (cutover.services.succession.successor_activate); connector owns the epoch rows."""
    assert transaction.get_connection().in_atomic_block, "the hand-over runs inside the caller's transaction"
    predecessor.drain()
    predecessor.save(update_fields=EPOCH_STATE_FIELDS)
    audit_record(actor=actor, entity=predecessor, action="successor_activate", from_state=EpochState.ACTIVE,
                 to_state=predecessor.state, evidence_digest=bytes(predecessor.digest),
                 reason=f"succeeded by {successor.epoch_id}")
    successor.activate()
    successor.save(update_fields=EPOCH_STATE_FIELDS)
    audit_record(actor=actor, entity=successor, action="successor_activate", from_state=EpochState.VERIFIED,
                 to_state=successor.state, evidence_digest=bytes(successor.digest),
                 reason=f"succeeds {predecessor.epoch_id}")
