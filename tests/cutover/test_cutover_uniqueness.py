"""The cutover's per-attempt facts are unique in PostgreSQL itself: a copy of a certificate or a barrier receipt
inserted around the services is refused by the constraint that holds the rule."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from cutover.models import CutoverReadinessCertificate, MaintenanceBarrierReceipt, V1ShutdownCertificate
from tests.cutover.test_v1_shutdown import drained, provider  # noqa: F401 - the fixture the world needs
from tests.cutover.v1_world import build_v1_world


def _insert_copy(row, **changes) -> None:
    row.pk = None
    for name, value in changes.items():
        setattr(row, name, value)
    with transaction.atomic():
        row.save(force_insert=True)


@pytest.mark.django_db
def test_one_certificate_of_each_kind_and_one_receipt_per_barrier_per_attempt(provider):  # noqa: F811
    """Through `v1_drained` the attempt has one readiness certificate, one shutdown certificate and one receipt
    per barrier and action. A second certificate for the same attempt (even with another digest) and a second
    receipt for the same barrier and action are each refused by PostgreSQL.
    Proves: CV2-15-008, CV2-15-010, CV2-15-011"""
    drained(build_v1_world())
    readiness = CutoverReadinessCertificate.objects.get()
    shutdown = V1ShutdownCertificate.objects.get()
    receipt = MaintenanceBarrierReceipt.objects.filter(action="closed").order_by("pk").first()
    assert readiness.attempt_id == shutdown.attempt_id

    for row, changes, constraint in (
            (readiness, {"digest": b"\x01" * 32}, "attempt_id_key"),
            (shutdown, {"digest": b"\x01" * 32}, "attempt_id_key"),
            (receipt, {}, "cutover_barrierreceipt_once")):
        with pytest.raises(IntegrityError, match=constraint):
            _insert_copy(type(row).objects.get(pk=row.pk), **changes)
    assert (CutoverReadinessCertificate.objects.count(), V1ShutdownCertificate.objects.count()) == (1, 1)
