"""The worker's outbound transactions, one path for one effect or many (issue 20, D-345..D-349; issue 39): a batch
of up to `n` `prepared` effects of ONE account whose destinations declare no rate limit (or of ONE limited
destination, D-372), claimed and granted in one transaction, and their confirmed settlements and finalizations in
one transaction. The committed `granted -> sending` markers of the batch are one transaction of the sole egress
adapter's send path (`effects.egress_batch.send_batch`), committed before any byte.

- `claim_candidates` / `effects_claim_batch`: the account is chosen in rotation from this process's cursor (the
  idea of the inbound batched claim, D-204/D-264: the next batch starts after the account this one served), its
  oldest claimable effects read without a lock; then ONE transaction in the canonical lock order
  (docs/locking.md): the serving guard once (`lock_serving`: epoch, account gate FOR SHARE; provider I/O held
  refuses), the credential dispatch gates of the batch FOR SHARE (fair advisory locks shared, then the rows,
  ascending generation), the effects `FOR UPDATE SKIP LOCKED` (ascending pk, re-checked: still `prepared`, lease
  free or expired, due, heading their owner slot, the batch's limiter), a limited batch's limiter FOR UPDATE, the
  holder FOR SHARE once; then one statement that moves the effects `prepared -> dispatching` (the state in the
  WHERE clause, the transition trigger fires per row), gives each a new lease fence and Attempt ordinal, appends
  the Attempts and the `granted` permits and, through the connector's audit writer (`audit_records_in`), the
  permits' audit rows. Per effect: its credential gate `enabled` (its fence copied into the permit; a gate that is
  not enabled leaves its effects untouched and claimable), its frozen secret version present (else it is
  quarantined CREDENTIAL_MATERIAL_MISSING, CV2-10-013), the holder running (else the whole claim is refused).
- `permits_settle_confirmed`: the `remote_confirmed` settlements of the batch (attempt outcome, permit
  `sending -> returned`, effect `dispatching -> remote_confirmed`, audit) in one statement, then in a savepoint their
  finalizations (RemoteLinks in one statement, `remote_confirmed -> finalized` in one); each statement writes its
  audit rows through the connector's audit writer; the settlement commits whatever happens to the
  finalization (D-336): a link conflict is marked as `effect_finalize` marks it, any other failure leaves the
  effects `remote_confirmed` for the worker's retry or the sweeper.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from connector import stage_metrics
from connector.faults import fault_point
from connector.selectors import locks as connector_locks
from connector.services.audit import audit_record, audit_records, audit_records_in
from connector.services.guard import lock_serving
from connector.services.secrets import secret_version_exists
from effects import locks
from effects.choices import EffectState, HolderState
from effects.errors import PermitRefused, ProviderIoHeld
from effects.models import DispatchPermit, ProcessGeneration, RemoteEffect
from effects.services import dispatch, identity
from effects.services.limiter import limiter_admit_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPermit:
    """One `granted` permit of a batch: what the sending marker and the exchange need, each naming its shard."""
    permit_pk: int
    effect_pk: int
    attempt_pk: int
    account_id: int
    holder_fence: int
    credential_gate_fence: int
    credential_generation_pk: int
    limiter_pk: int | None = None  # a limited destination's batch (D-372): its markers read the limiter


# Every candidate read and the re-check under the lock take only the effect that heads its owner slot (D-441).
_HEAD = identity.slot_head_sql("e")

# Where this process's next batch starts its rotation over accounts (round-robin across batches, D-346), and its
# next limited batch over limited destinations (D-372).
_ROTATION = {"start": 0, "limiter": 0}

# The batch's candidates (no lock): the first account with claimable unlimited effects at or after the cursor
# (else the first one before it, wrapping around), then its oldest claimable effects (a LATERAL subquery naming
# the account).
_CANDIDATES = """
WITH pick(account_id) AS (
    SELECT (
        SELECT a.account_id FROM (
            (SELECT e.account_id, 0 AS wrap FROM effects_remoteeffect e
               JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = e.account_id
              WHERE e.state = 'prepared' AND c.limiter_id IS NULL AND e.account_id >= %(start)s
                AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
                AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
              ORDER BY e.account_id LIMIT 1)
            UNION ALL
            (SELECT e.account_id, 1 AS wrap FROM effects_remoteeffect e
               JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = e.account_id
              WHERE e.state = 'prepared' AND c.limiter_id IS NULL AND e.account_id < %(start)s
                AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
                AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
              ORDER BY e.account_id LIMIT 1)) a ORDER BY a.wrap LIMIT 1)
)
SELECT x.id, p.account_id, x.credential_generation_id
  FROM pick p CROSS JOIN LATERAL (
    SELECT e.id, c.credential_generation_id FROM effects_remoteeffect e
      JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = p.account_id
     WHERE e.account_id = p.account_id AND e.state = 'prepared' AND c.limiter_id IS NULL
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
       AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
     ORDER BY e.id LIMIT %(n)s) x
 ORDER BY x.id""".replace("{head}", _HEAD)

# A given account's candidates (the claimer of one account, the scale-out path): every table pinned to the account.
_ACCOUNT_CANDIDATES = """
SELECT e.id, e.account_id, c.credential_generation_id FROM effects_remoteeffect e
  JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = %(account)s
 WHERE e.account_id = %(account)s AND e.state = 'prepared' AND c.limiter_id IS NULL
   AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
   AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
 ORDER BY e.id LIMIT %(n)s""".replace("{head}", _HEAD)

# The batch's effects FOR UPDATE SKIP LOCKED in ascending pk (entity rows after the guard and the credential
# gates), re-checked under the lock, with what the checks need from their commands (frozen, never moving).
_LOCK_EFFECTS = """
SELECT e.id, c.credential_generation_id, g.secret_version_ref, c.rate_requests_per_second, c.rate_max_in_flight,
       c.rate_burst
  FROM effects_remoteeffect e
  JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = %(account)s
  JOIN connector_credentialgeneration g ON g.id = c.credential_generation_id
 WHERE e.account_id = %(account)s AND e.id = ANY(%(ids)s::bigint[]) AND e.state = 'prepared'
   AND c.limiter_id IS NOT DISTINCT FROM %(limiter)s::bigint
   AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
   AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
 ORDER BY e.id LIMIT %(n)s
   FOR UPDATE OF e SKIP LOCKED""".replace("{head}", _HEAD)

# A limited batch's candidates (no lock, D-372): the first limited destination in rotation from the cursor (limiter
# id at or after it, else the first before it) whose `not_before` is due and that has claimable effects, then its
# oldest claimable effects. {account}: the account's own claimer pins every table to it.
_LIMITED_PICK = """
    (SELECT c.limiter_id, c.account_id, {wrap} AS wrap FROM effects_remoteeffect e
       JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = e.account_id
       JOIN effects_destinationlimiter l ON l.id = c.limiter_id AND l.account_id = c.account_id
      WHERE e.state = 'prepared' AND c.limiter_id {op} %(start)s{account}
        AND (l.not_before IS NULL OR l.not_before <= %(now)s)
        AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
        AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
      ORDER BY c.limiter_id LIMIT 1)""".replace("{head}", _HEAD)
_LIMITED_CANDIDATES = """
WITH pick(limiter_id, account_id) AS (
    SELECT a.limiter_id, a.account_id FROM ({first} UNION ALL {second}) a ORDER BY a.wrap LIMIT 1
)
SELECT x.id, p.account_id, x.credential_generation_id, p.limiter_id
  FROM pick p CROSS JOIN LATERAL (
    SELECT e.id, c.credential_generation_id FROM effects_remoteeffect e
      JOIN effects_outboundcommand c ON c.id = e.command_id AND c.account_id = p.account_id
     WHERE e.account_id = p.account_id AND e.state = 'prepared' AND c.limiter_id = p.limiter_id
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at < %(now)s)
       AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %(now)s) AND {head}
     ORDER BY e.id LIMIT %(n)s) x
 ORDER BY x.id""".replace("{head}", _HEAD)
_LIMITED = {scoped: _LIMITED_CANDIDATES.format(**{
    name: _LIMITED_PICK.format(wrap=wrap, op=op, account=(" AND e.account_id = %(account)s AND c.account_id = "
                                                          "%(account)s") if scoped else "")
    for name, wrap, op in (("first", 0, ">="), ("second", 1, "<"))}) for scoped in (False, True)}

# The grant, one statement (D-347): `prepared -> dispatching` with a new lease (fence + 1, ordinal + 1; the state
# compared again in the WHERE clause), each effect's Attempt (bound to its command's frozen epoch, request and
# credential generation), its `granted` permit (the guarded gate's and its credential gate's fences copied) and
# the permits' audit rows (`audited`, written by the connector's `audit_records_in` in the same statement).
_GRANT = """
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(credential_gates)s::bigint[], %(credential_fences)s::bigint[])
        AS d(id, credential_gate_id, credential_gate_fence)
), moved AS (
    UPDATE effects_remoteeffect e
       SET state = 'dispatching', attempt_count = e.attempt_count + 1, lease_fence = e.lease_fence + 1,
           lease_holder = %(holder_id)s, lease_expires_at = %(expires)s, changed_at = %(now)s
      FROM d WHERE e.account_id = %(account)s AND e.id = d.id AND e.state = 'prepared'
 RETURNING e.id, e.command_id, e.attempt_count, e.lease_fence
), attempts AS (
    INSERT INTO effects_remoteeffectattempt (effect_id, ordinal, holder_id, lease_fence, epoch_id,
        credential_generation_id, request_digest, provider_idempotency_key, claimed_at, lease_expires_at, outcome,
        response_status, response_digest, evidence, settled_at)
    SELECT m.id, m.attempt_count, %(holder_pk)s, m.lease_fence, c.epoch_id, c.credential_generation_id,
           c.request_digest, c.provider_idempotency_key, %(now)s, %(expires)s, '', NULL, NULL, '', NULL
      FROM moved m JOIN effects_outboundcommand c ON c.id = m.command_id AND c.account_id = %(account)s
 RETURNING id, effect_id, lease_fence
), permits AS (
    INSERT INTO effects_dispatchpermit (attempt_id, effect_id, gate_id, gate_fence, credential_gate_id,
        credential_gate_fence, holder_id, holder_fence, limiter_id, state, io_may_have_started, granted_at,
        sending_at, closed_at, abandonment_proof)
    SELECT a.id, a.effect_id, %(gate)s, %(gate_fence)s, d.credential_gate_id, d.credential_gate_fence,
           %(holder_pk)s, a.lease_fence, %(limiter)s::bigint, 'granted', false, %(now)s, NULL, NULL, ''
      FROM attempts a JOIN d ON d.id = a.effect_id
 RETURNING id, effect_id, attempt_id, holder_fence, credential_gate_fence
), audited AS (
    SELECT p.id AS entity_id, p.credential_gate_fence AS fence, '' AS reason, p.effect_id AS ord FROM permits p
)"""
_GRANTED = "SELECT p.id, p.effect_id, p.attempt_id, p.holder_fence, p.credential_gate_fence FROM permits p ORDER BY p.effect_id"


@dataclass(frozen=True)
class Candidate:
    """A claimable effect read without a lock: the batch claim locks and re-checks it."""
    effect_pk: int
    account_id: int
    credential_generation_pk: int
    limiter_pk: int | None = None


# Candidates read beyond a batch's size: workers that read the same oldest candidates at once each still find
# unlocked ones (the claim locks at most n of them, SKIP LOCKED), so a batch of one does not collide with its peers.
CANDIDATE_SLACK = 4


def claim_candidates(*, n: int, account_id: int | None = None, limited: bool = False) -> list[Candidate]:
    """Up to `n` + CANDIDATE_SLACK claimable effects of one account (or, `limited`, of ONE limited destination),
    read without a lock in ascending pk; the process's rotation cursor moves past the account (or destination)
    they belong to."""
    if n <= 0:
        return []
    args = {"account": account_id, "now": timezone.now(), "n": n + CANDIDATE_SLACK}
    with connection.cursor() as cursor:
        if limited:
            cursor.execute(_LIMITED[account_id is not None], {**args, "start": _ROTATION["limiter"]})
        else:
            cursor.execute(_CANDIDATES if account_id is None else _ACCOUNT_CANDIDATES,
                           {**args, "start": _ROTATION["start"]})
        rows = cursor.fetchall()
    candidates = [Candidate(row[0], row[1], row[2], row[3] if limited else None) for row in rows]
    if candidates and limited:
        _ROTATION["limiter"] = candidates[0].limiter_pk + 1
    elif candidates and account_id is None:
        _ROTATION["start"] = candidates[0].account_id + 1
    return candidates


def effects_claim_batch(*, holder: ProcessGeneration, n: int = 0, lease_seconds: int = 60,
                        account_id: int | None = None, limited: bool = False,
                        candidates: list[Candidate] | None = None) -> list[BatchPermit]:
    """Claim up to `n` effects of one account and grant their permits in one transaction (see the module), the
    first `n` of the given `candidates` that are still claimable and not locked by another claimer
    (`claim_candidates`' answer or a part of it: the worker splits a batch whose claim failed until the effect at
    fault stands alone; `n` 0: all of them), or of the candidates read now.
    `limited` (D-372): the effects of ONE limited destination instead (in rotation, its `not_before` due), the
    destination's limiter locked `FOR UPDATE` after the effects and before the holder, and only the prefix its
    admission allows granted (`limiter_admit_batch`: at most min(tokens, ceil((K - in flight) / 2))); a refusal
    writes only the limiter's refusal. Returns the granted permits in ascending effect pk; [] when nothing was
    claimable. A refusal (the account's gate does not serve, provider I/O held, the holder not running) raises and
    rolls back: nothing of the claim survives it. `fault_point("dispatch.batch_claim_before_commit")` fires before
    the COMMIT."""
    if candidates is None:
        candidates = claim_candidates(n=n, account_id=account_id, limited=limited)
    n = n or len(candidates)
    if not candidates or n <= 0:
        return []
    acct, limiter_pk = candidates[0].account_id, candidates[0].limiter_pk
    limited = limiter_pk is not None
    with transaction.atomic():
        ctx = lock_serving(account_id=acct)
        if ctx.provider_io_held:  # read with the epoch row the guard holds FOR SHARE (D-321)
            raise ProviderIoHeld(f"epoch {ctx.epoch_id} is active but its first activation is not read back yet; "
                                 "provider I/O is disabled")
        gates = connector_locks.credential_gates_for_share(c.credential_generation_pk for c in candidates)
        now = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(_LOCK_EFFECTS, {"account": acct, "ids": [c.effect_pk for c in candidates], "now": now, "n": n,
                                           "limiter": limiter_pk})
            locked = cursor.fetchall()
        if not locked:
            return []
        limiter = locks.limiter_for_update(limiter_pk) if limited else None
        holder_row = locks.holder_for_share(holder.pk)
        if holder_row.state != HolderState.RUNNING:
            raise PermitRefused(f"holder generation {holder_row.holder_id} is {holder_row.state}")
        chosen, present = [], {}
        for pk, generation_pk, ref, *rate in locked:
            gate = gates.get(generation_pk)
            if gate is None or gate.mode != "enabled":  # not granted: left prepared and claimable, nothing written
                continue
            if ref not in present:
                present[ref] = secret_version_exists(ref)
            if not present[ref]:
                _quarantine_missing_material(pk, acct)
                continue
            chosen.append((pk, gate, _Limit(*rate)))
        if limiter is not None and chosen:
            chosen = chosen[:limiter_admit_batch(limiter, [limit for _, _, limit in chosen], now)]
        if not chosen:
            return []
        expires = now + timedelta(seconds=lease_seconds)
        granted = audit_records_in(actor=dispatch.DISPATCHER, model=DispatchPermit, action="permit_acquire",
                                   to_state="granted", chain=(_GRANT, "audited", _GRANTED, {
            "ids": [pk for pk, _, _ in chosen], "credential_gates": [g.pk for _, g, _ in chosen],
            "credential_fences": [g.fence for _, g, _ in chosen], "account": acct,
            "holder_id": holder_row.holder_id, "holder_pk": holder_row.pk, "expires": expires, "now": now,
            "gate": ctx.gate_pk, "gate_fence": ctx.fence, "limiter": limiter_pk}))
        if len(granted) != len(chosen):  # every chosen row is locked and prepared: anything else is a defect
            raise AssertionError(f"{len(granted)} permits granted for {len(chosen)} locked effects")
        fault_point("dispatch.batch_claim_before_commit")
    generation_of = {pk: gate.credential_generation_id for pk, gate, _ in chosen}
    return [BatchPermit(permit_pk, effect_pk, attempt_pk, acct, holder_fence, gate_fence, generation_of[effect_pk],
                        limiter_pk)
            for permit_pk, effect_pk, attempt_pk, holder_fence, gate_fence in granted]


@dataclass(frozen=True)
class _Limit:
    """A limited command's frozen limit, as `limiter_admit` reads it from the command."""
    rate_requests_per_second: int | None
    rate_max_in_flight: int | None
    rate_burst: int | None


def _quarantine_missing_material(effect_pk: int, account_id: int) -> None:
    """As `_claim_and_permit_one` quarantines it (CV2-10-013): the locked effect, in the claim's transaction."""
    effect = RemoteEffect.objects.get(pk=effect_pk, account_id=account_id)
    effect.quarantine(reason="CREDENTIAL_MATERIAL_MISSING")
    effect.save()
    audit_record(actor=dispatch.DISPATCHER, entity=effect, action="effect_quarantine",
                 from_state=EffectState.PREPARED, to_state=effect.state,
                 reason="frozen credential secret version is absent; never falls forward")


@dataclass(frozen=True)
class Confirmed:
    """A `sending` permit whose exchange proved `remote_confirmed`: what its settlement and finalization write."""
    permit_pk: int
    effect_pk: int
    response_status: int | None
    response_digest: bytes | None
    remote_id: str
    evidence: str
    owner_slot: str
    commanded_at: datetime | None
    callout: str


# The confirmed settlements, one statement (D-348): each Attempt's outcome (written once), each permit
# `sending -> returned`, each effect `dispatching -> remote_confirmed` with its proven identity (both states compared
# again in the WHERE clauses) and each effect's `permit_settle` audit row (`audited`, written by the connector's
# `audit_records_in` in the same statement), as `settle_locked` writes them.
_SETTLE = """
WITH d AS (
    SELECT * FROM unnest(%(permits)s::bigint[], %(effects)s::bigint[], %(statuses)s::int[], %(digests)s::bytea[],
                         %(remote_ids)s::text[], %(evidence)s::text[], %(reasons)s::text[])
        WITH ORDINALITY AS d(permit_id, effect_id, status, digest, remote_id, evidence, reason, ord)
), permits AS (
    UPDATE effects_dispatchpermit p SET state = 'returned', closed_at = %(now)s
      FROM d WHERE p.id = d.permit_id AND p.effect_id = d.effect_id AND p.state = 'sending'
 RETURNING p.id, p.attempt_id, p.effect_id
), attempts AS (
    UPDATE effects_remoteeffectattempt a
       SET outcome = 'remote_confirmed', response_status = d.status, response_digest = d.digest,
           evidence = d.evidence, settled_at = %(now)s
      FROM permits p JOIN d ON d.permit_id = p.id
     WHERE a.id = p.attempt_id AND a.effect_id = p.effect_id AND a.outcome = ''
 RETURNING a.id
), effects AS (
    UPDATE effects_remoteeffect e SET state = 'remote_confirmed', remote_id = d.remote_id, changed_at = %(now)s
      FROM d WHERE e.account_id = %(account)s AND e.id = d.effect_id AND e.state = 'dispatching'
 RETURNING e.id
), audited AS (
    SELECT d.effect_id AS entity_id, NULL::bigint AS fence, d.reason, d.ord FROM d
)"""
_SETTLED = "SELECT (SELECT count(*) FROM permits), (SELECT count(*) FROM attempts), (SELECT count(*) FROM effects)"

# The finalizations' RemoteLinks, one statement (D-338's single-statement link, for the batch): a link one of the
# two partial unique indexes refuses is not inserted, and then it must be exactly this one already.
_LINKS = """
INSERT INTO effects_remotelink (account_id, owner_slot, remote_identity, effect_id, state, created_at)
SELECT %(account)s, v.slot, v.remote_id, v.effect_id, 'active', %(now)s
  FROM unnest(%(slots)s::text[], %(remote_ids)s::text[], %(effects)s::bigint[]) AS v(slot, remote_id, effect_id)
    ON CONFLICT DO NOTHING RETURNING effect_id"""

# The links that already hold an unlinked item's slot or remote identity (the conflict check of finalize_locked).
_EXISTING_LINKS = """
SELECT v.effect_id, l.owner_slot, l.remote_identity
  FROM unnest(%(slots)s::text[], %(remote_ids)s::text[], %(effects)s::bigint[]) AS v(slot, remote_id, effect_id)
  JOIN effects_remotelink l ON l.account_id = %(account)s AND l.state = 'active'
   AND (l.owner_slot = v.slot OR l.remote_identity = v.remote_id)"""

# `remote_confirmed -> finalized` (lease cleared) and the `effect_finalize` audit rows (the connector's
# `audit_records`), one statement.
_FINALIZE = """
UPDATE effects_remoteeffect e SET state = 'finalized', lease_holder = '', lease_expires_at = NULL, changed_at = %(now)s
 WHERE e.account_id = %(account)s AND e.id = ANY(%(effects)s::bigint[]) AND e.state = 'remote_confirmed'
RETURNING e.id, NULL::bigint AS fence"""


def permits_settle_confirmed(*, account_id: int, items: list[Confirmed]) -> dict[int, RemoteEffect]:
    """Settle the batch's `remote_confirmed` answers and finalize them in one transaction (see the module). The
    effects FOR UPDATE (ascending pk), then their permits FOR UPDATE (ascending pk), then the writes. Returns the
    settled effects by pk, as committed (`finalized`, or `remote_confirmed` when their finalization was held or
    failed). Any item whose effect or permit is not as the batch left it (`dispatching`, `sending`) makes the
    whole transaction refuse (PermitRefused) before any write: the caller then settles each item alone, which
    decides it exactly as before. `fault_point("dispatch.batch_settle_before_commit")` fires before the COMMIT."""
    if not items:
        return {}
    items = sorted(items, key=lambda i: i.effect_pk)
    effect_pks = [i.effect_pk for i in items]
    with transaction.atomic():
        effects = {e.pk: e for e in RemoteEffect.objects.select_for_update(of=("self",))
                   .filter(account_id=account_id, pk__in=effect_pks).order_by("pk").only("id", "state")}
        permits = {p.pk: p for p in locks.permits_for_update([i.permit_pk for i in items], effect_ids=effect_pks)}
        for i in items:
            effect, permit = effects.get(i.effect_pk), permits.get(i.permit_pk)
            if effect is None or permit is None or permit.effect_id != i.effect_pk:
                raise PermitRefused(f"permit #{i.permit_pk} does not belong to effect #{i.effect_pk} of that account")
            if permit.state != "sending" or effect.state != EffectState.DISPATCHING:
                raise PermitRefused(f"permit is {permit.state}, effect {effect.state}; the batch settles only "
                                    "sending permits of dispatching effects")
        now = timezone.now()
        [moved] = audit_records_in(
            actor=dispatch.DISPATCHER, model=RemoteEffect, action="permit_settle", from_state=EffectState.DISPATCHING,
            to_state=EffectState.REMOTE_CONFIRMED, chain=(_SETTLE, "audited", _SETTLED, {
                "permits": [i.permit_pk for i in items], "effects": effect_pks,
                "statuses": [i.response_status for i in items], "digests": [i.response_digest for i in items],
                "remote_ids": [i.remote_id for i in items], "evidence": [i.evidence for i in items],
                "reasons": [f"remote_confirmed: {i.evidence}"[:500] for i in items], "now": now,
                "account": account_id}))
        if list(moved) != [len(items)] * 3:
            raise AssertionError(f"settled {moved} rows for {len(items)} confirmed permits")
        finalized = _finalize_in_savepoint(account_id=account_id, items=items)
        if finalized is not None:
            _mark_conflicts(account_id, [i.effect_pk for i in items if i not in finalized])
        fault_point("dispatch.batch_settle_before_commit")
    return {e.pk: e for e in RemoteEffect.objects.filter(account_id=account_id, pk__in=effect_pks)} \
        if finalized is not None else {}



def _mark_conflicts(account_id: int, effect_pks: list[int]) -> None:
    for pk in effect_pks:
        dispatch.mark_link_conflict(RemoteEffect(pk=pk, account_id=account_id),
                                    f"remote identity or slot of effect #{pk} is linked elsewhere; nothing was linked")


def _finalize_in_savepoint(*, account_id: int, items: list[Confirmed]) -> list[Confirmed] | None:
    """The batch's finalizations in a savepoint (see `permits_settle_confirmed`). Returns the items finalized (the
    others' links conflict: the caller marks them), or None when the finalization failed and rolled back (all left
    `remote_confirmed`)."""
    try:
        with transaction.atomic():
            now = timezone.now()
            linking = [i for i in items if i.owner_slot and i.remote_id]
            conflicts: list[int] = []
            if linking:
                args = {"account": account_id, "now": now, "slots": [i.owner_slot for i in linking],
                        "remote_ids": [i.remote_id for i in linking], "effects": [i.effect_pk for i in linking]}
                with connection.cursor() as cursor:
                    cursor.execute(_LINKS, args)
                    linked = {row[0] for row in cursor.fetchall()}
                    unlinked = [i for i in linking if i.effect_pk not in linked]
                    if unlinked:
                        cursor.execute(_EXISTING_LINKS, {**args, "slots": [i.owner_slot for i in unlinked],
                                                         "remote_ids": [i.remote_id for i in unlinked],
                                                         "effects": [i.effect_pk for i in unlinked]})
                        found = cursor.fetchall()
                        wanted = {i.effect_pk: (i.owner_slot, i.remote_id) for i in unlinked}
                        conflicts = sorted({pk for pk, *link in found if tuple(link) != wanted[pk]}
                                           | (set(wanted) - {pk for pk, *_ in found}))
            done = [i for i in items if i.effect_pk not in set(conflicts)]
            moved = audit_records(actor=dispatch.DISPATCHER, model=RemoteEffect, action="effect_finalize",
                                  from_state=EffectState.REMOTE_CONFIRMED, to_state=EffectState.FINALIZED,
                                  moved=(_FINALIZE, {"account": account_id, "now": now,
                                                     "effects": [i.effect_pk for i in done]}, "id"))
            if moved != len(done):
                raise AssertionError(f"finalized {moved} of {len(done)} confirmed effects")
            fault_point("dispatch.finalize_in_settlement")
    except Exception as exc:  # noqa: BLE001 - never lose the settlement: the worker or the sweeper finalizes later
        log.warning("batch finalization in the settlement failed; left remote_confirmed",
                    extra={"effects": [i.effect_pk for i in items], "error": type(exc).__name__})
        return None
    for i in done:
        stage_metrics.effect_finalized(callout=i.callout, commanded_at=i.commanded_at, finalized_at=now)
    return done
