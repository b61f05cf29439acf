"""Outbound authoring: Runtime's application transaction inserts one OutboundCommand with its complete
FrozenDispatchBinding and exactly one RemoteEffect. Retries of the same logical effect converge on the same rows
(CV2-10-001..015, CV2-10-047)."""
from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from functools import lru_cache

from django.db import IntegrityError, transaction
from django.db.backends.signals import connection_created

from connector.canonical.profiles import profile_for
from connector.errors import roots_closed
from connector.receipts import canonical_json, rec
from connector.selectors.owners import binding_definition_read
from connector.selectors.rows import ServiceConfigurationCredentialMapping, ServingEpoch, ServingEpochBindingProof
from connector.services.guard import ServingContext, lock_serving
from connector.interpreters import callout as callout_paths
from connector.services.set_insert import insert_rows
from effects.choices import LinkState
from effects.errors import OutboundConflict, OutboundPathUnsafe, OutboundRefused, RateLimitInvalid
from effects.models import DestinationLimiter, OutboundCommand, RemoteEffect, RemoteLink
from effects.services import identity
from effects.services.retry import frozen_schedule

PATH_MAX_LENGTH = OutboundCommand._meta.get_field("path").max_length


@dataclass(frozen=True)
class FrozenBinding:
    """One binding of an exact epoch, as its owner reader verified it: everything outbound authoring freezes from
    it. Plain values only (no model instance), so a cached copy cannot be mutated or lazily re-read."""

    pack_generation_pk: int
    pack_generation_id: str
    pack_payload_digest: bytes
    definition_version: int
    credential_refs: tuple[str, ...]
    definition_bytes: bytes
    canonical_definition_digest: bytes

    def definition(self) -> dict:
        return json.loads(self.definition_bytes)


@dataclass(frozen=True)
class EpochFacts:
    """The immutable columns of a serving epoch that authoring freezes (never its preimage)."""

    profile_id: str
    configuration_pk: int
    configuration_generation_id: str


class _Absent(Exception):
    """Nothing to cache: raised inside a cached reader so that `lru_cache` keeps no entry for an absent row (a row
    inserted later is found by the next call)."""


# Every cache below is keyed by the exact identity of immutable rows (the epoch's pk *and* digest; a configuration
# generation's pk): PostgreSQL refuses UPDATE and DELETE of binding proofs, pack generations, definitions,
# configuration generations and their credential mappings (connector migration 0002, IMMUTABLE_TABLES), and of a
# serving epoch every column but its state (decision D-220). A cached entry therefore can never describe another
# generation; it saves 6-8 SELECTs per authored command (issue 20).

@lru_cache(maxsize=1024)
def _frozen_binding(epoch_digest: bytes, epoch_pk: int, kind: str, business_key: str) -> FrozenBinding:
    proof = (ServingEpochBindingProof.objects.select_related("binding", "pack_generation")
             .defer("pack_generation__payload")
             .filter(epoch_id=epoch_pk, epoch__digest=epoch_digest, binding__kind=kind,
                     binding__business_key=business_key).first())
    if proof is None:
        raise _Absent
    b = proof.binding
    definition = binding_definition_read(kind=kind, pack_generation_id=proof.pack_generation.generation_id,
                                         pack_payload_digest=bytes(b.pack_payload_digest),
                                         business_key=b.business_key, definition_version=b.definition_version)
    return FrozenBinding(pack_generation_pk=proof.pack_generation_id,
                         pack_generation_id=proof.pack_generation.generation_id,
                         pack_payload_digest=bytes(b.pack_payload_digest), definition_version=b.definition_version,
                         credential_refs=tuple(b.credential_refs or ()), definition_bytes=bytes(definition.definition),
                         canonical_definition_digest=bytes(definition.canonical_definition_digest))


def frozen_binding(*, epoch_pk: int, epoch_digest: bytes, kind: str, business_key: str) -> FrozenBinding:
    """The `kind` binding `business_key` of the exact epoch (pk and digest), read through its owner reader once per
    process. Raises OutboundRefused when the epoch has no such binding (never cached)."""
    try:
        return _frozen_binding(bytes(epoch_digest), epoch_pk, kind, business_key)
    except _Absent:
        raise OutboundRefused(f"the epoch has no {kind} binding {business_key!r}") from None


@lru_cache(maxsize=256)
def _epoch_facts(epoch_digest: bytes, epoch_pk: int) -> EpochFacts:
    row = (ServingEpoch.objects.filter(pk=epoch_pk, digest=epoch_digest)
           .values_list("profile_id", "configuration_id", "configuration__generation_id").first())
    if row is None:
        raise _Absent
    return EpochFacts(*row)


@lru_cache(maxsize=4096)
def _credential_mapping(configuration_pk: int, account_id: int, credential_ref: str) -> tuple[int, str]:
    row = (ServiceConfigurationCredentialMapping.objects
           .filter(generation_id=configuration_pk, account_id=account_id, credential_ref=credential_ref)
           .values_list("credential_generation_id", "credential_generation__generation_id").first())
    if row is None:
        raise _Absent
    return row


def clear_caches(**_signal) -> None:
    """Forget every cached frozen fact. Runs whenever this process opens a database session: a restore of the
    database (cutover/services/pg_snapshot.restore_default) terminates every application session and may bring
    back primary keys the caches saw before, so no entry outlives the session it was read in."""
    _frozen_binding.cache_clear()
    _epoch_facts.cache_clear()
    _credential_mapping.cache_clear()
    _FROZEN_TEMPLATES.clear()


connection_created.connect(clear_caches, weak=False, dispatch_uid="effects.services.outbound.clear_caches")


def outbound_path(template: str, path_params: dict[str, object]) -> str:
    """The one builder of an outbound request path: the callout's frozen template filled with percent-encoded
    values (connector.interpreters.callout.build_path). A value that would change the path's structure raises
    OutboundPathUnsafe before anything is written (D-170)."""
    try:
        return callout_paths.build_path(template, path_params, max_length=PATH_MAX_LENGTH)
    except callout_paths.PathValueUnsafe as exc:
        raise OutboundPathUnsafe(f"path_template {template!r}: {exc}", placeholder=exc.name) from exc


_FROZEN_TEMPLATES: dict[tuple[int, bytes, str], str] = {}


def frozen_path_template(command: OutboundCommand) -> str:
    """The path template of the callout a command froze, for the command's method: the create definition's, or the
    `update` variant's when the command addresses a linked remote identity (D-190). Read through the owner reader
    from the command's exact epoch, cached in-process by the epoch's exact identity (pk + digest) and the callout
    key: an epoch's bindings never change. Raises OutboundRefused/OwnerFactInvalid when the binding cannot be read
    or is invalid."""
    key = (command.epoch_id, bytes(command.epoch_digest), command.callout)
    templates = _FROZEN_TEMPLATES.get(key)
    if templates is None:
        definition = frozen_binding(epoch_pk=command.epoch_id, epoch_digest=bytes(command.epoch_digest),
                                    kind="callout_profile", business_key=command.callout).definition()
        templates = {definition["method"]: definition["path_template"]}
        update = definition.get("update")
        if isinstance(update, dict):
            templates.setdefault(update["method"], update["path_template"])
        _FROZEN_TEMPLATES[key] = templates
    template = templates.get(command.method)
    if template is None:
        raise OutboundRefused(f"callout {command.callout!r} declares no {command.method} path")
    return template


RATE_LIMIT_MAX = 100_000


def declared_rate_limit(callout_def: dict) -> dict | None:
    """The callout definition's `rate_limit`, validated and completed: `{"requests_per_second": R,
    "max_in_flight": K, "burst": B}` (B defaults to min(K, R): a destination idle for a while gets at most B
    permits at once). None when the callout declares none. Raises RateLimitInvalid (nothing written, D-222)."""
    declared = callout_def.get("rate_limit")
    if declared is None:
        return None
    if not isinstance(declared, dict) or not set(declared) <= {"requests_per_second", "max_in_flight", "burst"}:
        raise RateLimitInvalid(f"rate_limit must be an object of requests_per_second, max_in_flight and an "
                               f"optional burst, not {declared!r}")
    values = {}
    for name in ("requests_per_second", "max_in_flight", "burst"):
        value = declared.get(name)
        if value is None and name == "burst":
            continue
        if type(value) is not int or not 1 <= value <= RATE_LIMIT_MAX:
            raise RateLimitInvalid(f"rate_limit.{name} must be an integer from 1 to {RATE_LIMIT_MAX}, not {value!r}")
        values[name] = value
    rps, k = values["requests_per_second"], values["max_in_flight"]
    burst = values.get("burst", min(k, rps))
    if burst > rps:
        raise RateLimitInvalid(f"rate_limit.burst must not exceed requests_per_second ({rps}), not {burst}")
    return {"requests_per_second": rps, "max_in_flight": k, "burst": burst}


def _destination_limiter_pk(account_id: int, callout: str) -> int:
    """The destination's limiter row, created at its first limited command (inside the authoring transaction, so
    it exists exactly when a command references it). Usually one SELECT; never locks the row."""
    rows = DestinationLimiter.objects.filter(account_id=account_id, callout=callout).values_list("pk", flat=True)
    pk = rows.first()
    if pk is None:
        DestinationLimiter.objects.bulk_create([DestinationLimiter(account_id=account_id, callout=callout)],
                                               ignore_conflicts=True)
        pk = rows.first()
    return pk


def idempotency_key(*, profile_id: str, account_key: str, application_scope: str, effect_root_id: str,
                    effect_slot_id: str, effect_generation_id: str) -> bytes:
    return profile_for(profile_id).digest("outbound-idempotency-key", rec(
        account_key=account_key, application_scope=application_scope, effect_root_id=effect_root_id,
        effect_slot_id=effect_slot_id, effect_generation_id=effect_generation_id))


def outbound_command_author(**call) -> OutboundCommand:
    """One command authored as a batch of one (`outbound_commands_author(calls=[call])`), returned as its row: for
    the callers that need the command itself (a successor generation, the tests)."""
    (pk,) = outbound_commands_author(calls=[call])
    return OutboundCommand.objects.get(pk=pk, account_id=call["ctx"].account_id)


def _links(pairs: set[tuple[int, str]]) -> dict[tuple[int, str], RemoteLink]:
    """The active RemoteLink of each (account, owner slot) pair, in one read (at most one per pair:
    `effects_link_one_active_per_slot`)."""
    if not pairs:
        return {}
    rows = RemoteLink.objects.filter(account_id__in=sorted({a for a, _ in pairs}),
                                     owner_slot__in=sorted({s for _, s in pairs}), state=LinkState.ACTIVE)
    return {(link.account_id, link.owner_slot): link for link in rows if (link.account_id, link.owner_slot) in pairs}


def _existing(wanted: list[tuple[int, bytes]]) -> dict[tuple[int, bytes], tuple[int, None, bytes]]:
    """The commands already authored under the (account, idempotency key) pairs, in one read (the key is derived
    from the account key, so naming the account finds the same row and keeps the read single-shard, D-241)."""
    if not wanted:
        return {}
    return {(c.account_id, bytes(c.idempotency_key)): (c.pk, None, bytes(c.binding_digest)) for c in
            OutboundCommand.objects.filter(account_id__in=sorted({a for a, _ in wanted}),
                                           idempotency_key__in=[k for _, k in wanted])
            .only("id", "account_id", "idempotency_key", "binding_digest")}


def _insert_commands(rows: list[dict], *, skip_conflicts: bool = True) -> dict[bytes, int]:
    """Insert the new commands with one statement: idempotency key -> pk of the rows inserted. `skip_conflicts`:
    a row whose key a concurrent author committed first is skipped (`ON CONFLICT DO NOTHING` waits for that
    author, then skips) instead of failing the caller's transaction. A succession drain that closed the epoch's
    roots refuses with SUCCESSION_ROOTS_CLOSED (D-315)."""
    try:
        return {bytes(key): pk for pk, key in insert_rows(OutboundCommand, rows, returning=("id", "idempotency_key"),
                                                          conflict_nothing=skip_conflicts)}
    except IntegrityError as exc:
        if (closed := roots_closed(exc)) is not None:
            raise closed from None
        raise


def _converge(lost: list[dict]) -> dict[bytes, int]:
    """The commands a concurrent author committed first under the keys of `lost` (rows the insert skipped), in one
    read: key -> its pk when its binding is byte-identical; OUTBOUND_CONFLICT otherwise. A row skipped by another
    unique rule (no command under its key) is inserted alone, which raises that rule's IntegrityError."""
    won = _existing([(row["account_id"], bytes(row["idempotency_key"])) for row in lost])
    out = {}
    for row in lost:
        winner = won.get((row["account_id"], bytes(row["idempotency_key"])))
        if winner is None:
            _insert_commands([row], skip_conflicts=False)
            raise AssertionError("a skipped command inserted alone")  # pragma: no cover - the insert raised
        _same_binding(winner[2], row["binding_digest"], row)
        out[bytes(row["idempotency_key"])] = winner[0]
    return out


def outbound_commands_author(*, calls: list[dict]) -> list[int]:
    """Author one OutboundCommand and its RemoteEffect per call, inside the caller's application transaction,
    which already holds each call's serving guard (`ctx`: gate `v2_serving`, exact active epoch); returns the
    commands' pks in call order. One call is a batch of one. Each call freezes every reference from that exact
    epoch (`_prepare`): push contract and callout definitions, configuration, the account's exact credential
    generation for the callout's CredentialRef, the request bytes and digest, the provider idempotency key if
    the contract supports one. With an `owner_slot` that has an active RemoteLink, the command addresses that
    linked remote identity through the callout's `update` variant (the RemoteLink is the identity authority; the
    pushed fields never select it, CV2-10-059).

    Refusals, before any write: a replay context (`suppress_external_effects`, OUTBOUND_REFUSED); a guard that
    moved since `ctx` (each call's guard is taken again with its exact epoch and fence, answered from the rows
    this transaction holds); whatever `_prepare` refuses. A key that already exists, repeats within the calls,
    or is committed meanwhile by a concurrent author converges on that command when its binding is
    byte-identical and fails closed (OUTBOUND_CONFLICT) otherwise (CV2-10-001..015, CV2-10-047).

    Statements for any number of calls: the slots' active RemoteLinks (one read, when a call names a slot), the
    existing commands of the keys (one read), the new commands (one insert), their RemoteEffects (one insert);
    a key a concurrent author won adds one read for it."""
    assert transaction.get_connection().in_atomic_block, "authored inside the application transaction"
    if any(call["suppress_external_effects"] for call in calls):
        raise OutboundRefused("a replay execution context cannot author outbound commands")
    # The guard is taken again here, in this transaction, with the caller's exact fence and epoch: a context
    # from an earlier transaction cannot author after the gate moved.
    ctxs = [lock_serving(account_id=c["ctx"].account_id, epoch_id=c["ctx"].epoch_id,
                         epoch_digest=c["ctx"].epoch_digest, expected_fence=c["ctx"].fence) for c in calls]
    links = _links({(ctx.account_id, c["owner_slot"]) for ctx, c in zip(ctxs, calls) if c.get("owner_slot")})
    prepared = []
    for ctx, call in zip(ctxs, calls):
        slot = call.get("owner_slot", "")
        prepared.append(_prepare(
            ctx=ctx, account_key=call["account_key"], application_scope=call["application_scope"],
            effect_root_id=call["effect_root_id"], effect_slot_id=call["effect_slot_id"],
            effect_generation_id=call["effect_generation_id"], push_contract=call["push_contract"],
            callout=call["callout"], path_params=call["path_params"], body=call["body"],
            source_execution_id=call.get("source_execution_id"), predecessor=call.get("predecessor"),
            owner_slot=slot, link=links.get((ctx.account_id, slot)) if slot else None))
    existing = _existing(sorted({(f["account_id"], key) for f, _, key in prepared}))
    # Each call resolves to an existing command's pk or to the index of a new row (a key repeated within the
    # calls resolves like an existing one, to the first row): (pk, None, digest) or (None, index, digest).
    rows, order, seen = [], [], {}
    for fields, digest, key in prepared:
        ident = (fields["account_id"], key)
        found = existing.get(ident) or seen.get(ident)
        if found is None:
            row = {k: v for k, v in fields.items() if k not in ("predecessor", "target_link")}
            row["predecessor_id"] = fields["predecessor"].pk if fields["predecessor"] is not None else None
            row["target_link_id"] = fields["target_link"].pk if fields["target_link"] is not None else None
            rows.append({**row, "binding_digest": digest})
            found = seen[ident] = (None, len(rows) - 1, digest)
        _same_binding(found[2], digest, fields)
        order.append(found)
    pks: list[int] = []
    if rows:
        inserted = _insert_commands(rows)
        converged = _converge([row for row in rows if bytes(row["idempotency_key"]) not in inserted])
        pks = [inserted.get(bytes(row["idempotency_key"])) or converged[bytes(row["idempotency_key"])]
               for row in rows]
        ours = [(pk, row) for pk, row in zip(pks, rows) if bytes(row["idempotency_key"]) in inserted]
        if ours:
            insert_rows(RemoteEffect, [effect_row(command_id=pk, fields=row) for pk, row in ours])
    return [pk if pk is not None else pks[index] for pk, index, _ in order]


def _same_binding(existing_digest: bytes, digest: bytes, fields: dict) -> None:
    if not hmac.compare_digest(existing_digest, digest):
        raise OutboundConflict(f"logical effect {fields['effect_root_id']}/{fields['effect_slot_id']}/"
                               f"{fields['effect_generation_id']} exists with a different frozen binding")


def effect_row(*, command_id: int, fields: dict) -> dict:
    """The RemoteEffect authored with a command (`fields`, from `_prepare`), for both authoring paths: its logical
    effect digest is the command's idempotency key, and it carries the command's owner slot, whose pushes are
    sent one at a time in authored order (D-441)."""
    return dict(command_id=command_id, logical_effect_digest=fields["idempotency_key"],
                account_id=fields["account_id"], owner_slot=fields["owner_slot"])


def _prepare(*, ctx: ServingContext, account_key: str, application_scope: str, effect_root_id: str,
             effect_slot_id: str, effect_generation_id: str, push_contract: str, callout: str,
             path_params: dict[str, str], body: dict, source_execution_id: int | None,
             predecessor: OutboundCommand | None, owner_slot: str, link) -> tuple[dict, bytes, bytes]:
    """Everything an authored command freezes, from the exact guarded epoch `ctx` and the slot's active RemoteLink
    `link` (read by the caller): (the command's fields, its FrozenDispatchBinding digest, its idempotency key).
    The calls' guards and links are read by `outbound_commands_author` for all of them at once."""
    try:
        epoch = _epoch_facts(bytes(ctx.epoch_digest), ctx.epoch_pk)
    except _Absent:  # pragma: no cover - the guard just locked this exact epoch
        raise OutboundRefused(f"epoch {ctx.epoch_id} with the guarded digest is absent") from None
    push = frozen_binding(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, kind="push_contract",
                          business_key=push_contract)
    callout_binding = frozen_binding(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, kind="callout_profile",
                                     business_key=callout)
    push_def, callout_def = push.definition(), callout_binding.definition()
    refs = callout_binding.credential_refs
    if not refs:
        raise OutboundRefused(f"callout {callout!r} names no CredentialRef")
    try:
        credential_generation_pk, credential_generation_id = _credential_mapping(
            epoch.configuration_pk, ctx.account_id, refs[0])
    except _Absent:
        raise OutboundRefused(f"no exact credential generation for ({account_key}, {refs[0]}) in the epoch") from None
    profile = profile_for(epoch.profile_id)
    key = idempotency_key(profile_id=epoch.profile_id, account_key=account_key, application_scope=application_scope,
                          effect_root_id=effect_root_id, effect_slot_id=effect_slot_id,
                          effect_generation_id=effect_generation_id)
    request_body = canonical_json(body)
    rate = declared_rate_limit(callout_def)
    callout_def, path_params = identity.callout_address(callout_def, path_params, link)
    path = outbound_path(callout_def["path_template"], path_params)
    provider_key = key.hex() if push_def.get("idempotency") == "provider_key" else None
    policy = {"max_attempts": int(push_def.get("max_attempts", 3)), "timeout_ms": int(callout_def.get("timeout_ms", 5000))}
    if rate is not None:
        # Only a declared limit enters the digest: commands of callouts without one keep their exact bytes.
        policy["rate_limit"] = rate
    retry_schedule, declared = frozen_schedule(callout_def)
    if declared:  # as the rate limit: only a declared schedule enters the digest (D-420)
        policy["retry"] = retry_schedule
    route_policy_digest = profile.digest("route-policy", canonical_json(policy))
    request_digest = profile.digest("outbound-request", rec(method=callout_def["method"], path=path,
                                                            body=request_body, provider_key=provider_key))
    fields = dict(
        account_id=ctx.account_id, application_scope=application_scope, effect_root_id=effect_root_id,
        effect_slot_id=effect_slot_id, effect_generation_id=effect_generation_id, idempotency_key=key,
        source_execution_id=source_execution_id, epoch_id=ctx.epoch_pk, epoch_digest=ctx.epoch_digest,
        gate_fence=ctx.fence, profile_id=epoch.profile_id, pack_generation_id=push.pack_generation_pk,
        pack_payload_digest=push.pack_payload_digest, effect_definition=push_contract,
        effect_version=push.definition_version, callout=callout, route_policy_digest=route_policy_digest,
        configuration_id=epoch.configuration_pk, credential_generation_id=credential_generation_pk,
        method=callout_def["method"], path=path, request_body=request_body, request_digest=request_digest,
        provider_idempotency_key=provider_key, max_attempts=policy["max_attempts"], retry_schedule=retry_schedule,
        predecessor=predecessor, predecessor_digest=bytes(predecessor.binding_digest) if predecessor else None,
        owner_slot=owner_slot, target_link=link,
        rate_requests_per_second=rate and rate["requests_per_second"], rate_max_in_flight=rate and rate["max_in_flight"],
        rate_burst=rate and rate["burst"],
        limiter_id=_destination_limiter_pk(ctx.account_id, callout) if rate is not None else None)
    binding_digest = profile.digest("frozen-dispatch-binding", rec(
        idempotency_key=key, epoch_digest=ctx.epoch_digest, pack_generation=push.pack_generation_id,
        pack_payload_digest=fields["pack_payload_digest"], definition_digest=push.canonical_definition_digest,
        effect_definition=push_contract, effect_version=fields["effect_version"],
        route_policy_digest=route_policy_digest, configuration=epoch.configuration_generation_id,
        credential_generation=credential_generation_id, request_digest=request_digest,
        provider_key=provider_key,
        predecessor_digest=bytes(predecessor.binding_digest) if predecessor else None))
    return fields, binding_digest, key


def outbound_successor_author(*, ctx: ServingContext, predecessor_command_id: int, effect_generation_id: str,
                              body: dict, path_params: dict[str, str], account_key: str) -> OutboundCommand:
    """An intentional new remote call for the same EffectRoot and slot: a separate authorized business intent,
    admitted only when the predecessor effect is proven terminal `no_effect`. `prepared`/`dispatching` must be
    resumed, `remote_confirmed`/`finalized` proves the effect happened, `uncertain` and `quarantined` block
    until reconciled (seed "Replay and external effects"; decision 12). The successor carries explicit linkage
    (predecessor and its binding digest), the predecessor's owner slot, and a newly frozen dispatch binding. The
    operator-facing admission that reconciles every predecessor of the root and slot under their row locks is
    `effects.services.intents.remote_call_authorize` (D-305)."""
    assert transaction.get_connection().in_atomic_block
    predecessor = OutboundCommand.objects.select_related("effect").get(pk=predecessor_command_id)
    state = predecessor.effect.state
    if state != "no_effect":
        raise OutboundRefused(f"predecessor effect is {state}; only a proven terminal no_effect admits a successor "
                              "generation")
    if predecessor.effect_generation_id == effect_generation_id:
        raise OutboundRefused("a successor needs a new EffectGenerationID")
    return outbound_command_author(
        ctx=ctx, account_key=account_key, application_scope=predecessor.application_scope,
        effect_root_id=predecessor.effect_root_id, effect_slot_id=predecessor.effect_slot_id,
        effect_generation_id=effect_generation_id, push_contract=predecessor.effect_definition,
        callout=predecessor.callout, path_params=path_params, body=body, suppress_external_effects=False,
        predecessor=predecessor, owner_slot=predecessor.owner_slot)

