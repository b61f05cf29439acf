"""One item of the quarantine and halt board: what is held, since when, its closed reason (code, evidence, alert
deadline, owner, remedy). Its own module so the board's sources (selectors, poison) share it without importing
each other."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from .reasons import Reason, Remedy, reason


@dataclass(frozen=True)
class Item:
    kind: str  # effect | delivery | execution | lane | component | gate | credential_gate | delivery_gate | v1_effect
    pk: int
    title: str
    state: str
    code: str
    since: datetime  # when the fact that halted or quarantined the item was recorded
    evidence_url: str  # the admin rows behind it
    decide_url: str = ""  # the page where the remedy is taken, where the product offers one
    hint: str = ""  # what the remedy would do for this item (e.g. whether a replay runs)

    @property
    def reason(self) -> Reason:
        return reason(self.code)

    @property
    def remedy(self) -> Remedy:
        return self.reason.remedy

    @property
    def deadline(self) -> datetime:
        return self.since + self.reason.deadline

    @property
    def overdue(self) -> bool:
        return timezone.now() > self.deadline
