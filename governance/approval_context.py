"""What an approver reads before deciding a dual-approval request (issue 38): the subject in words with a link to
its own page, and the change it approves as before/after rows, per kind. Read-only, from the durable facts; the
rules (who may approve or refuse, the digest) stay in connector.services.approvals.

- remote identity change (a relink): the effect with its RemoteLink conflict; before, the slot's links the
  relink retires; after, the slot linked to the proven identity and the effect finalized. Once applied, the rows
  come from the RemoteLinkResolution that used the approval (what was done, not what would be).
- set of remote identity changes (many relinks under one approval, D-494): each member as a row: its effect
  with a link, the identity change before/after (as applied, once applied), the member digest the requester saw,
  and whether it still holds (a changed member is refused alone when the set is applied).
- activation decision: the verified epoch and the account gates it would serve; links to the cutover console.
- readiness certificate and restore point: the certificate's (or restore point's) subject and the cutover step it
  unblocks; links to the service cutover attempt's console page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.urls import NoReverseMatch, reverse

from connector.selectors.rows import AccountServingGate, ApprovalKind, DualApprovalRequest, ServingEpoch
from connector.services import approvals
from effects.selectors import RemoteEffect
from effects.services import identity


@dataclass
class Context:
    what: str  # the approved change in words
    link: tuple[str, str] | None = None  # (label, url) of the subject's own page
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (aspect, before, after)
    note: str = ""  # how the before/after were read
    members: list[Member] = field(default_factory=list)  # a set subject's members (D-494), in the set's order


@dataclass
class Member:
    """One member of a set of relinks as the approval page shows it."""

    key: str  # the member's subject key (effect:N)
    link: tuple[str, str] | None  # (label, url) of the effect's page
    before: str
    after: str
    digest: str  # hex of the member digest the requester saw (and the approvers approve)
    holds: bool  # the member's current digest is still that one
    status: str  # waiting | applied | resolved otherwise | changed
    pk: int | None = None  # the effect's pk and the change time the page shows (the apply form's state token)
    token: str = ""


def _identity_change(effect, approval_pk: int) -> tuple[list[tuple[str, str, str]], str, bool]:
    """(before/after rows, how they were read, applied under this approval) of one effect's relink."""
    resolution = getattr(effect, "link_resolution", None)
    if resolution is not None and resolution.approval_id == approval_pk:
        retired = list(effect.account.remote_links.filter(pk__in=resolution.retired_links).order_by("pk"))
        before = "; ".join(f"link #{x.pk}: {x.owner_slot} → {x.remote_identity}" for x in retired) or "no link"
        return ([(f"Owner slot {resolution.owner_slot!r}", before,
                  f"link #{resolution.new_link_id}: {resolution.owner_slot} → {resolution.proven_identity}"),
                 (f"Effect #{effect.pk}", "remote_confirmed, REMOTE_LINK_CONFLICT", effect.state)],
                "As applied (the RemoteLinkResolution that used this approval).", True)
    slot = identity.effect_slot(effect)
    in_the_way = identity.conflicting_links(effect, slot)
    before = "; ".join(f"link #{x.pk}: {x.owner_slot} → {x.remote_identity}" for x in in_the_way) or "no link"
    return ([(f"Owner slot {slot!r}", before,
              f"new link: {slot} → {effect.remote_id} ({len(in_the_way)} link(s) retired)"),
             (f"Effect #{effect.pk}", f"{effect.state}, {effect.quarantine_reason or 'no reason code'}", "finalized")],
            "As it would be applied now (read from the current links).", False)


def _relink_set(row: DualApprovalRequest) -> Context:
    members = list(row.members.order_by("ordinal"))
    pks = [identity.member_effect_pk(m.member_key) for m in members]
    effects = {e.pk: e for e in RemoteEffect.objects.select_related("command", "account", "link_resolution")
               .filter(pk__in=[pk for pk in pks if pk is not None])}
    shown = []
    for member, pk in zip(members, pks, strict=True):
        effect = effects.get(pk)
        approved = bytes(member.member_digest)
        if effect is None:
            shown.append(Member(member.member_key, None, "—", "the effect no longer exists", approved.hex(), False,
                                "changed"))
            continue
        rows, _, applied = _identity_change(effect, row.pk)
        current, _ = approvals.subject_current(identity.APPROVAL_KIND, member.member_key)
        holds = current == approved
        status = ("applied" if applied else "resolved otherwise" if getattr(effect, "link_resolution", None)
                  else "waiting" if holds else "changed")
        shown.append(Member(member.member_key, (f"Effect #{effect.pk} ({effect.state}) of account {effect.account}",
                                                reverse("governance:effect", args=[effect.pk])),
                            rows[0][1], rows[0][2], approved.hex(), holds, status, effect.pk,
                            effect.changed_at.isoformat()))
    accounts = sorted({str(e.account) for e in effects.values()})
    return Context(what=(f"Relink {len(members)} owner slot(s) (account {', '.join(accounts) or '—'}) to the remote "
                         "identities their providers proved, under this one approval; each relink is applied on its "
                         "own, only while its digest is still the one shown here"),
                   note="Each member as it would be applied now, or as applied under this approval.", members=shown)


def _relink(row: DualApprovalRequest) -> Context:
    kind, _, raw = row.subject_key.partition(":")
    effect = (RemoteEffect.objects.select_related("command", "account").filter(pk=int(raw)).first()
              if kind == "effect" and raw.isdigit() else None)
    if effect is None:
        return Context(what=f"Relink the owner slot of {row.subject_key} (the effect no longer exists)")
    slot = identity.effect_slot(effect)
    link = (f"Effect #{effect.pk} ({effect.state}{', ' + effect.quarantine_reason if effect.quarantine_reason else ''})"
            f" of account {effect.account}", reverse("governance:effect", args=[effect.pk]))
    what = (f"Change the remote identity of owner slot {slot!r} (account {effect.account}) to the identity the "
            f"provider proved for effect #{effect.pk}, {effect.remote_id!r}")
    rows, note, _ = _identity_change(effect, row.pk)
    return Context(what=what, link=link, note=note, rows=rows)


def _activation(row: DualApprovalRequest) -> Context:
    epoch = (ServingEpoch.objects.select_related("configuration").defer("preimage", "configuration__payload")
             .filter(epoch_id=row.subject_key).first())
    link = (f"Cutover console: epoch {row.subject_key}", reverse("governance:cutover"))
    if epoch is None:
        return Context(what=f"Activate ServingEpoch {row.subject_key} (no such epoch)", link=link)
    accounts = epoch.configuration.accounts.values_list("account_id", flat=True)
    gates = AccountServingGate.objects.filter(account_id__in=list(accounts)).select_related("epoch")
    modes: dict[str, int] = {}
    serving: set[str] = set()
    for gate in gates:
        modes[gate.mode] = modes.get(gate.mode, 0) + 1
        if gate.epoch_id is not None:
            serving.add(gate.epoch.epoch_id)
    gate_words = ", ".join(f"{n} {mode}" for mode, n in sorted(modes.items())) or "no gate yet"
    return Context(
        what=(f"Activate ServingEpoch {epoch.epoch_id} for configuration {epoch.configuration.generation_id}: its "
              f"accounts' gates serve it"), link=link, note="Read from the epoch and its accounts' gates now.",
        rows=[(f"ServingEpoch {epoch.epoch_id}", epoch.state, "active"),
              ("Epoch the accounts' gates name", ", ".join(sorted(serving)) or "none", epoch.epoch_id),
              ("Account gates", gate_words, "v2_serving")])


def _attempt_link(key: str) -> tuple[str, str] | None:
    try:
        return (f"Service cutover attempt {key}", reverse("governance:attempt", args=[key]))
    except NoReverseMatch:
        return None


def _readiness(row: DualApprovalRequest) -> Context:
    return Context(what=f"Accept the readiness certificate of service cutover {row.subject_key}",
                   link=_attempt_link(row.subject_key),
                   rows=[("Certificate's subject", "—", row.summary),
                         ("Cutover step", "the publication barriers may not close",
                          "the publication barriers may close (V1 halts, the cutover proceeds)")])


def _restore_point(row: DualApprovalRequest) -> Context:
    return Context(what=f"Accept the rehearsed V1 restore point of service cutover {row.subject_key}",
                   link=_attempt_link(row.subject_key),
                   rows=[("Restore point", "—", row.summary),
                         ("Cutover step", "validation may not begin",
                          "validation may begin, with this restore point as the way back")])


KINDS = {"remote_identity_change": _relink, "remote_identity_change_set": _relink_set,
         "activation_decision": _activation,
         "readiness_certificate": _readiness, "restore_point": _restore_point}


def approval_context(row: DualApprovalRequest) -> Context:
    build = KINDS.get(row.kind)
    return build(row) if build else Context(what=row.summary)


@dataclass
class Filed:
    waiting: list[DualApprovalRequest]  # every pending request, of every kind, oldest first
    relinks: list[DualApprovalRequest]  # decided remote identity changes, newest first
    cutover: list[DualApprovalRequest]  # decided cutover subjects, newest first


def filed_requests(*, recent: int = 20) -> Filed:
    """The dual-approval requests as the attestations screen files them: what waits for approvers (every kind),
    then the recently decided ones under their own heading (relinks apart from cutover subjects)."""
    rows = DualApprovalRequest.objects.select_related("requested_by", "refused_by").prefetch_related(
        "approvals__approver")
    decided = rows.exclude(state="pending").order_by("-pk")
    relink = (ApprovalKind.REMOTE_IDENTITY_CHANGE, ApprovalKind.REMOTE_IDENTITY_CHANGE_SET)
    return Filed(waiting=list(rows.filter(state="pending").order_by("pk")),
                 relinks=list(decided.filter(kind__in=relink)[:recent]),
                 cutover=list(decided.exclude(kind__in=relink)[:recent]))


def certification_context(cert) -> Context:
    """A platform-attested receiver certification: the receiver identity it certifies, linked to its binding in
    the facts (admin), and the binding's certified identity before and after."""
    binding = cert.binding
    try:
        link = (f"Receiver binding {binding.name}", reverse("admin:effects_receiverbinding_change", args=[binding.pk]))
    except NoReverseMatch:
        link = None
    current = (binding.certifications.filter(state="certified").exclude(pk=cert.pk).order_by("-valid_until")
               .first())
    before = (f"principal {current.principal_id}, account {current.account_id}, valid until "
              f"{current.valid_until:%Y-%m-%d}" if current else "no certified identity")
    after = f"principal {cert.principal_id}, account {cert.account_id}, valid until {cert.valid_until:%Y-%m-%d}"
    return Context(
        what=(f"Certify receiver binding {binding.name}'s remote identity (platform attested): principal "
              f"{cert.principal_id}, account {cert.account_id}, from {cert.verified_at:%Y-%m-%d %H:%M} to "
              f"{cert.valid_until:%Y-%m-%d %H:%M}"), link=link, note="Read from the binding's certifications now.",
        rows=[("Certified remote identity", before, after)])
