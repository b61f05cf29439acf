"""Board items of poison quarantines (decision D-168): receipts whose materialization is held, windows quarantined,
delivery operations held, prepared epochs the sweeper stopped verifying. Executions, lanes and effects already
appear on the board through their own quarantine columns. Each item's `since` is its latest StepFailure (the
evidence), and its evidence link opens the page that shows that evidence."""
from __future__ import annotations

from django.db.models import Max
from django.urls import reverse

from connector.selectors.rows import MaterializationDue, ProjectionWindow, ServingEpoch, StepFailure
from effects.selectors import DeliveryOperation

from .items import Item


def _latest(model, pks) -> dict[str, object]:
    rows = (StepFailure.objects.filter(entity_type=model._meta.label, entity_id__in=[str(pk) for pk in pks])
            .values("entity_id").annotate(at=Max("at")))
    return {row["entity_id"]: row["at"] for row in rows}


def _failures_url(model, pk) -> str:
    return reverse("admin:connector_stepfailure_changelist") + f"?entity_type={model._meta.label}&entity_id={pk}"


def poison_items() -> list:
    """The board items (governance.selectors.Item), in no particular order: the board groups them by reason."""
    item_class = Item
    items = []
    held = list(MaterializationDue.objects.select_related("receipt").exclude(held_reason=""))
    items += [item_class("receipt", d.receipt_id, f"Receipt #{d.receipt_id} ({d.receipt.channel})", "held",
                         d.held_reason, d.held_at, reverse("admin:connector_receipt_change", args=[d.receipt_id]))
              for d in held]
    windows = list(ProjectionWindow.objects.filter(state="quarantined"))
    since = _latest(ProjectionWindow, [w.pk for w in windows])
    items += [item_class("window", w.pk, f"Window #{w.pk} {w.route}/{w.grouping_key}", w.state,
                         w.quarantine_reason, since.get(str(w.pk), w.closes_at), _failures_url(ProjectionWindow, w.pk))
              for w in windows]
    operations = list(DeliveryOperation.objects.select_related("parent").exclude(held_reason=""))
    items += [item_class("delivery", o.pk, f"Delivery #{o.pk} {o.parent.parent_key}/{o.ordinal} (held)", o.state,
                         o.held_reason, o.held_at, _failures_url(DeliveryOperation, o.pk)) for o in operations]
    epochs = set(StepFailure.objects.filter(entity_type=ServingEpoch._meta.label, reason_code="EPOCH_VERIFY_FAILED")
                 .values_list("entity_id", flat=True))
    prepared = ServingEpoch.objects.filter(pk__in=[int(pk) for pk in epochs], state="prepared")
    since = _latest(ServingEpoch, [e.pk for e in prepared])
    items += [item_class("epoch", e.pk, f"Epoch {e.epoch_id}", e.state, "EPOCH_VERIFY_FAILED", since[str(e.pk)],
                         _failures_url(ServingEpoch, e.pk)) for e in prepared]
    return items
