"""Identity governance (issue 17, D-180): every identity change is an append-only audit record, and two approvals
count only from independent people.

`identity_record` is the write path of the identity audit: called by the receivers in connector.identity for
every path that changes an account (the admin, a management command, a shell), inside the transaction of the
change. `approver_require_independent` is what a dual approval calls under its request's row lock before it
records an approval."""
from __future__ import annotations

import json

from django.db import transaction

from connector.actors import Actor, current_actor
from connector.errors import ApproverNotIndependent
from connector.selectors.identity import cooling_period, dependent_on
from connector.services.audit import audit_record


def identity_record(*, subject, action: str, before: dict, after: dict, from_state: str = "", to_state: str = "",
                    actor: Actor | None = None):
    """One identity change: actor, subject (a user or a group), before and after (never a password hash)."""
    actor = actor or current_actor()
    reason = json.dumps({"before": before, "after": after}, sort_keys=True, default=str)
    with transaction.atomic():
        return audit_record(actor=actor, entity=subject, action=action, from_state=from_state, to_state=to_state,
                            reason=reason)


def approver_require_independent(*, approver_id: int, requester_id: int, other_approver_ids: list[int]) -> None:
    """Refuse (APPROVER_NOT_INDEPENDENT) an approval whose approver shares a controller with the requester or with
    another approver of the same subject within the cooling period: one person holding two accounts (or having
    just minted, granted, activated or reset one) must not count twice."""
    shared = dependent_on(approver_id, [pk for pk in (requester_id, *other_approver_ids) if pk is not None])
    if shared:
        people = sorted({pk for common in shared.values() for pk in common})
        hours = int(cooling_period().total_seconds() // 3600)
        raise ApproverNotIndependent(
            f"user #{approver_id} is not independent of user(s) {', '.join(f'#{pk}' for pk in sorted(shared))} "
            f"of this request: account(s) {', '.join(f'#{pk}' for pk in people)} controlled both within the "
            f"{hours} h identity cooling period (see the identity audit trail)")
