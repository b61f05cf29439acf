"""Parent plans and generation admission (the contract's `parent_plan` and `mutation_policies.linearization`).

`parent_plan_and_admit` runs the barriers in order:
1. materialize the immutable parent (its frozen records and digest) in its own transaction, verify completeness
   and digest, and close the source snapshot (`snapshot_closed_at`); an existing parent is never re-planned: the
   same inputs continue it, different inputs are REST_DELIVERY_INTENT_CONFLICT;
2. compile the plan deterministically from the frozen parent alone;
3. in ONE transaction (read committed + explicit domain lock): lock the parent, insert-on-conflict then
   SELECT ... FOR UPDATE the effect conflict domain lock row, query overlapping operations and the interval
   watermarks, reject stale or unresolved overlap, insert every child and seal it (planned -> sealed with its
   payload digest), record the plan digests and move the parent PLANNING -> ADMITTED; commit before any submit.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date, datetime

from django.db import connection, transaction
from django.db.backends.postgresql.psycopg_any import DateRange, DateTimeTZRange
from django.db.models import Q
from django.utils import timezone

from connector.actors import Actor
from connector.canonical.encoding import Record
from connector.services.audit import audit_record
from effects.delivery import identity
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryError, DeliveryRequestInvalid
from effects.delivery.watermark import highest_over
from effects.models import DeliveryOperation, DeliveryParent, DeliveryProfile, EffectDomainLock, ReceiverBinding
from effects.choices import ParentState
from effects.models import DeliveryWatermark

from .setup import canonical_json, current_secret_ref

PLANNER_VERSION = "tiling-by-record-boundary.v1"
SYSTEM = Actor.system("delivery")


@dataclass(frozen=True)
class ConflictDomain:
    remote_principal_id: str
    remote_account_id: str
    remote_resource_namespace: str
    receiver_resource_id: str
    effect_conflict_group: str

    def digest(self) -> bytes:
        return identity.effect_conflict_domain(**self.__dict__)


def domain_locks(domains: list[ConflictDomain]) -> list[EffectDomainLock]:
    """Acquire-or-create then SELECT ... FOR UPDATE the domain lock rows, in canonical order (domain digest)."""
    by_digest = {d.digest(): d for d in domains}
    ordered = sorted(by_digest)
    with connection.cursor() as cursor:
        for digest in ordered:
            d = by_digest[digest]
            cursor.execute(
                "INSERT INTO rest_delivery_effect_domain_lock (domain_digest, remote_principal_id, remote_account_id,"
                " remote_resource_namespace, receiver_resource_id, effect_conflict_group, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, now()) ON CONFLICT (domain_digest) DO NOTHING",
                [digest, d.remote_principal_id, d.remote_account_id, d.remote_resource_namespace,
                 d.receiver_resource_id, d.effect_conflict_group])
    return list(EffectDomainLock.objects.select_for_update().filter(domain_digest__in=ordered)
                .order_by("domain_digest"))


def domain_lock_for_update(domain_pk: int) -> EffectDomainLock:
    return EffectDomainLock.objects.select_for_update().get(pk=domain_pk)


# -- scopes and generations -----------------------------------------------------------------------------------

def make_range(kind: str, start, end):
    if not start < end:
        raise DeliveryRequestInvalid("a scope is a non-empty half-open range [start, end)")
    return DateRange(start, end, "[)") if kind == "date" else DateTimeTZRange(start, end, "[)")


def scope_filter(kind: str, rng) -> Q:
    return Q(scope_date__overlap=rng) if kind == "date" else Q(scope_ts__overlap=rng)


def scope_kwargs(kind: str, rng) -> dict:
    return {"scope_date": rng} if kind == "date" else {"scope_ts": rng}


def gen_gt(end: datetime, revision: int, prefix: str = "") -> Q:
    return Q(**{f"{prefix}generation_end__gt": end}) | Q(**{f"{prefix}generation_end": end,
                                                             f"{prefix}correction_revision__gt": revision})


def gen_lt(end: datetime, revision: int) -> Q:
    return Q(generation_end__lt=end) | Q(generation_end=end, correction_revision__lt=revision)


def unresolved_states() -> list[str]:
    c = contract()
    return [name for name in c.tuples if c.is_unresolved(name)]


def check_generation_fence(*, domain: EffectDomainLock, kind: str, policy: str, rng, gen_end: datetime,
                           revision: int, exclude_parent_pk: int | None, for_submit: bool) -> None:
    """The admission rules, evaluated under the domain lock. Raises the contract's error for the first breach:
    - partition_replace: a watermark at or above this generation over any overlapping point, or an admitted
      higher overlapping generation: REST_DELIVERY_STALE_GENERATION (a fully applied generation stales every
      lower overlap for good; a lower one never enters SUBMITTING after a higher admission);
      a lower overlapping generation still effect-unresolved: REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT;
    - incremental_append: the exact scope already fully applied: REST_DELIVERY_APPEND_SCOPE_ALREADY_APPLIED
      (unless the profile records the contract's exception); exactly the same scope unresolved:
      REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT."""
    others = DeliveryOperation.objects.filter(domain=domain)
    if exclude_parent_pk is not None:
        others = others.exclude(parent_id=exclude_parent_pk)
    unresolved = Q(state__in=unresolved_states(), reconciled=False)
    field = "scope_date" if kind == "date" else "scope_ts"
    if policy == "incremental_append":
        exact = others.filter(**{field: rng})
        if exact.filter(remote_effect="FULLY_APPLIED").exists():
            raise DeliveryError("REST_DELIVERY_APPEND_SCOPE_ALREADY_APPLIED",
                                f"scope {rng} was already applied in this effect conflict domain")
        if exact.filter(unresolved).exists():
            raise DeliveryError("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT",
                                f"an operation over exactly {rng} is not effect-resolved")
        return
    marks = [(w.scope.lower, w.scope.upper, (w.generation_end, w.correction_revision))
             for w in DeliveryWatermark.objects.filter(domain=domain).filter(scope_filter(kind, rng))]
    highest = highest_over(marks, rng.lower, rng.upper)
    if highest is not None and highest >= (gen_end, revision):
        raise DeliveryError("REST_DELIVERY_STALE_GENERATION",
                            f"generation ({gen_end.isoformat()}, {revision}) is not above the applied watermark "
                            f"({highest[0].isoformat()}, {highest[1]}) over {rng}")
    overlapping = others.filter(scope_filter(kind, rng))
    higher = overlapping.filter(gen_gt(gen_end, revision)).order_by("pk").first()
    if higher is not None:
        raise DeliveryError("REST_DELIVERY_STALE_GENERATION",
                            f"operation #{higher.pk} of a higher overlapping generation "
                            f"({higher.generation_end.isoformat()}, {higher.correction_revision}) is admitted")
    if not for_submit:
        same = overlapping.filter(generation_end=gen_end, correction_revision=revision).first()
        if same is not None:
            raise DeliveryError("REST_DELIVERY_INTENT_CONFLICT",
                                f"operation #{same.pk} of another plan claims the same generation over an "
                                "overlapping scope")
    lower = overlapping.filter(gen_lt(gen_end, revision)).filter(unresolved).order_by("pk").first()
    if lower is not None:
        raise DeliveryError("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT",
                            f"lower overlapping operation #{lower.pk} is {lower.state}: effect unresolved")


# -- the planner ----------------------------------------------------------------------------------------------

def _point(kind: str, text: str):
    try:
        value = date.fromisoformat(text) if kind == "date" else datetime.fromisoformat(text)
    except (TypeError, ValueError) as exc:
        raise DeliveryRequestInvalid(f"{text!r} is not an ISO {kind}") from exc
    if kind == "timestamp" and value.tzinfo is None:
        raise DeliveryRequestInvalid(f"timestamp {text!r} has no UTC offset")
    return value


def _frozen(records: list[dict]) -> bytes:
    return canonical_json(sorted(records, key=lambda r: (r["at"], canonical_json(r)))).encode()


def compile_plan(kind: str, start, end, frozen: bytes, max_per_child: int) -> list[tuple]:
    """Deterministic tiling of [start, end) into child scopes from the frozen records alone: consecutive chunks of
    at most `max_per_child` records, each boundary at the first record of the next chunk (never splitting records
    with the same `at`). Returns [(child_start, child_end, records)]; the child scopes tile the parent exactly."""
    records = json.loads(frozen)
    chunks: list[list[dict]] = []
    for record in records:
        if chunks and len(chunks[-1]) < max_per_child or (chunks and chunks[-1][-1]["at"] == record["at"]):
            chunks[-1].append(record)
        else:
            chunks.append([record])
    if not chunks:
        return [(start, end, [])]
    bounds = [start] + [_point(kind, chunk[0]["at"]) for chunk in chunks[1:]] + [end]
    return [(bounds[i], bounds[i + 1], chunk) for i, chunk in enumerate(chunks)]


def coverage_proof(kind: str, start, end, children: list[tuple]) -> dict:
    tiles = all(children[i][1] == children[i + 1][0] for i in range(len(children) - 1))
    tiles = tiles and children[0][0] == start and children[-1][1] == end
    if not tiles:
        raise DeliveryRequestInvalid("the plan does not tile the parent scope")
    return {"parent_scope": [str(start), str(end)], "children": [[str(s), str(e), len(r)] for s, e, r in children],
            "records": sum(len(r) for _, _, r in children), "tiles": True}


def _child_body(*, namespace: bytes, key: bytes, mutation_key: bytes, scope: tuple, generation: str,
                records: list[dict]) -> bytes:
    return canonical_json({"delivery_key": key.hex(), "receiver_mutation_key": mutation_key.hex(),
                           "operation_namespace": namespace.hex(), "scope": [str(scope[0]), str(scope[1])],
                           "generation": generation, "records": records}).encode()


# -- the service --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanRequest:
    namespace: dict  # platform_instance_id, tenant_id, environment_id, namespace_revision
    parent_key: str
    binding: ReceiverBinding
    profile: DeliveryProfile
    logical_route_id: str
    source_boundary: str
    receiver_resource_id: str
    effect_conflict_group: str
    scope_start: object
    scope_end: object
    interval_end: datetime
    correction_revision: int
    records: list  # each a JSON object with "at" (ISO date or timestamp inside the scope)


def _materialize(req: PlanRequest, namespace: bytes, rng, domain: ConflictDomain) -> DeliveryParent:
    kind = req.profile.scope_kind
    for record in req.records:
        if not isinstance(record, dict) or "at" not in record:
            raise DeliveryRequestInvalid("every record is an object with an 'at' position")
        if not (req.scope_start <= _point(kind, record["at"]) < req.scope_end):
            raise DeliveryRequestInvalid(f"record at {record['at']} is outside the parent scope")
    frozen = _frozen(req.records)
    digest = hashlib.sha256(frozen).digest()
    existing = DeliveryParent.objects.filter(namespace=namespace, parent_key=req.parent_key).first()
    if existing is not None:
        if bytes(existing.frozen_parent_digest) != digest or existing.profile_id != req.profile.pk or \
                existing.binding_id != req.binding.pk or existing.scope != rng or \
                existing.generation != (req.interval_end, req.correction_revision):
            raise DeliveryError("REST_DELIVERY_INTENT_CONFLICT",
                                f"parent {req.parent_key} exists with another frozen parent; it never re-plans")
        return existing
    with transaction.atomic():
        (lock,) = domain_locks([domain])
        parent = DeliveryParent.objects.create(
            namespace=namespace, parent_key=req.parent_key, binding=req.binding, profile=req.profile, domain=lock,
            logical_route_id=req.logical_route_id, source_boundary=req.source_boundary, frozen_parent=frozen,
            frozen_parent_digest=digest, record_count=len(req.records), generation_end=req.interval_end,
            correction_revision=req.correction_revision, **scope_kwargs(kind, rng))
        # Verify completeness and digest from what was stored, then close the source snapshot.
        stored = DeliveryParent.objects.get(pk=parent.pk)
        if hashlib.sha256(bytes(stored.frozen_parent)).digest() != digest or \
                len(json.loads(bytes(stored.frozen_parent))) != len(req.records):
            raise DeliveryRequestInvalid("the frozen parent does not read back complete")
        DeliveryParent.objects.filter(pk=parent.pk).update(snapshot_closed_at=timezone.now())
        audit_record(actor=SYSTEM, entity=parent, action="delivery_parent_materialize", evidence_digest=digest)
    return DeliveryParent.objects.get(pk=parent.pk)


def parent_plan_and_admit(req: PlanRequest) -> DeliveryParent:
    c = contract()
    profile = req.profile
    kind = profile.scope_kind
    if req.correction_revision < 0:
        raise DeliveryRequestInvalid("the correction revision is a non-negative integer")
    if profile.mutation_policy == "incremental_append" and req.correction_revision != 0 and \
            not c.raw["mutation_policies"]["incremental_append"]["correction_revision_allowed"] and \
            profile.append_exception is None:
        raise DeliveryError("REST_DELIVERY_INTENT_CONFLICT",
                            "incremental_append refuses correction generations (no certified exception)")
    if not current_secret_ref(req.binding):
        raise DeliveryRequestInvalid("the binding has no secret version")
    namespace = identity.operation_namespace(**req.namespace)
    rng = make_range(kind, req.scope_start, req.scope_end)
    domain = ConflictDomain(req.binding.remote_principal_id, req.binding.remote_account_id,
                            req.binding.remote_resource_namespace, req.receiver_resource_id,
                            req.effect_conflict_group)
    parent = _materialize(req, namespace, rng, domain)
    if parent.state == ParentState.ADMITTED:
        return parent
    frozen = bytes(parent.frozen_parent)
    children = compile_plan(kind, req.scope_start, req.scope_end, frozen, profile.max_records_per_child)
    proof = coverage_proof(kind, req.scope_start, req.scope_end, children)
    generation = identity.generation_text(req.interval_end.isoformat(), req.correction_revision)
    binding_digest = bytes(req.binding.semantics_digest)
    op_semantics = bytes(profile.operation_semantics_digest)
    semantics = profile.operation_semantics
    descriptors, rows = [], []
    for ordinal, (start, end, records) in enumerate(children, start=1):
        crng = make_range(kind, start, end)
        # The target effect scope names where the effect lands (receiver resource, conflict group) and the range.
        target = f"{req.receiver_resource_id}/{req.effect_conflict_group}[{start},{end})"
        key = identity.delivery_key(logical_route_id=req.logical_route_id, target_effect_scope=target,
                                    source_boundary=req.source_boundary, mutation_kind=profile.mutation_policy,
                                    explicit_generation=generation)
        mutation_key = identity.receiver_mutation_key(operation_namespace=namespace, delivery_key=key)
        body = _child_body(namespace=namespace, key=key, mutation_key=mutation_key, scope=(start, end),
                           generation=generation, records=records)
        payload_digest = hashlib.sha256(body).digest()
        rendered = identity.rendered_request_semantics(
            method=semantics["method_semantics"], normalized_rendered_path=semantics[
                "authority_relative_path_semantics"], normalized_rendered_query=canonical_json(
                semantics["normalized_query_semantics"]), all_non_secret_semantic_headers=canonical_json(
                {"Content-Type": "application/json", "Idempotency-Key": mutation_key.hex()}),
            ordered_scalar_multipart_parts=[], file_part_name="", deterministic_filename=f"{key.hex()}.json",
            content_disposition="", content_type="application/json", deterministic_boundary="",
            sealed_payload_digest=payload_digest)
        intent = identity.mutation_intent(receiver_binding_semantics_digest=binding_digest,
                                          operation_semantics_digest=op_semantics,
                                          rendered_request_semantics_digest=rendered)
        cproof = {"parent": req.parent_key, "ordinal": ordinal, "scope": [str(start), str(end)],
                  "records": len(records)}
        descriptors.append(Record([("ordinal", ordinal), ("delivery_key", key), ("payload_digest", payload_digest),
                                   ("scope", target), ("records", len(records))]))
        rows.append(dict(ordinal=ordinal, frontier_order=ordinal, namespace=namespace,
                         logical_route_id=req.logical_route_id, target_effect_scope=target,
                         source_boundary=req.source_boundary, mutation_kind=profile.mutation_policy,
                         explicit_generation=generation, delivery_key=key, receiver_mutation_key=mutation_key,
                         binding=req.binding, profile=profile, payload=body, payload_digest=payload_digest,
                         record_count=len(records), coverage_proof=cproof,
                         rendered_request_semantics_digest=rendered, mutation_intent_digest=intent,
                         generation_end=req.interval_end, correction_revision=req.correction_revision,
                         **scope_kwargs(kind, crng)))
    compiled = hashlib.sha256(canonical_json(proof).encode() + b"".join(
        r["payload_digest"] for r in rows)).digest()
    plan_digest = identity.parent_plan(
        frozen_parent_digest=bytes(parent.frozen_parent_digest), compiled_plan_digest=compiled,
        profile_contract_digest=bytes(profile.profile_contract_digest), planner_algorithm_version=PLANNER_VERSION,
        ordered_child_descriptors=descriptors, complete_coverage_proof=Record([("tiles", True), (
            "records", proof["records"]), ("children", len(children))]))
    with transaction.atomic():
        locked = DeliveryParent.objects.select_for_update().get(pk=parent.pk)
        if locked.state == ParentState.ADMITTED:
            return locked
        (lock,) = domain_locks([domain])
        for row in rows:
            # A child of another namespace may already hold this delivery key's admission: same intent is the
            # same admission (refused here as a re-plan of another parent), a different intent conflicts.
            clash = DeliveryOperation.objects.filter(namespace=namespace, delivery_key=row["delivery_key"]).first()
            if clash is not None:
                raise DeliveryError("REST_DELIVERY_INTENT_CONFLICT",
                                    f"delivery key of child {row['ordinal']} is already admitted (#{clash.pk})")
            check_generation_fence(domain=lock, kind=kind, policy=profile.mutation_policy,
                                   rng=row.get("scope_date") or row.get("scope_ts"), gen_end=req.interval_end,
                                   revision=req.correction_revision, exclude_parent_pk=locked.pk, for_submit=False)
        for row in rows:
            op = DeliveryOperation.objects.create(parent=locked, domain=lock, **row)
            op.to_sealed()  # planned -> sealed: complete payload seal (sealed_payload_digest persisted)
            op.revision += 1
            op.save()
            audit_record(actor=SYSTEM, entity=op, action="delivery_seal", from_state="planned", to_state=op.state,
                         evidence_digest=row["payload_digest"])
        locked.planner_algorithm_version = PLANNER_VERSION
        locked.compiled_plan_digest = compiled
        locked.coverage_proof = proof
        locked.parent_plan_digest = plan_digest
        locked.admit(at=timezone.now())
        locked.save()
        audit_record(actor=SYSTEM, entity=locked, action="delivery_parent_admit", from_state="PLANNING",
                     to_state="ADMITTED", evidence_digest=plan_digest)
    return DeliveryParent.objects.get(pk=parent.pk)
