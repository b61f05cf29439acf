"""REST bulk delivery starts no provider I/O while a service cutover's first activation awaits its exact readback
(CV2-12-071, D-321): the submit (MAY_ATTEMPT marker, attempt, SUBMITTING) and the egress adapter's pre-I/O
compare-and-swap both read `provider_io_held` in their gate's share-lock statement and refuse with
PROVIDER_IO_NOT_ENABLED, writing nothing."""
from __future__ import annotations

import pytest

from connector.models import ServingEpoch
from effects.errors import ProviderIoHeld
from effects.models import DeliveryAttempt, MayAttemptMarker
from effects.services.delivery import execution


def _held_epoch(name: str) -> ServingEpoch:
    """An epoch whose first activation committed and is not read back (staged: only its provider_io_held matters
    to the delivery path)."""
    return ServingEpoch.objects.create(epoch_id=name, serving_scope_digest=b"s" * 32, preimage=b"p",
                                       digest=name.encode().ljust(32, b"0"), provider_io_held=True)


def test_no_delivery_submit_or_request_starts_before_the_activation_readback(world):
    """A held epoch refuses the submit (no marker, no attempt, the operation still sealed) and, once a submit got
    through, the pre-I/O compare-and-swap (the attempt not started); after the readback cleared it both proceed.
    Proves: CV2-12-071"""
    op = world.plan().children.first()
    epoch = _held_epoch("held-1")
    with pytest.raises(ProviderIoHeld) as info:
        execution.submit(op.pk)
    assert info.value.code == "PROVIDER_IO_NOT_ENABLED"
    op.refresh_from_db()
    assert op.state == "sealed" and not MayAttemptMarker.objects.filter(operation=op).exists()
    assert not DeliveryAttempt.objects.filter(operation=op).exists()

    ServingEpoch.objects.filter(pk=epoch.pk).update(provider_io_held=False)  # the readback's write
    result = execution.submit(op.pk)
    assert result.attempt is not None

    _held_epoch("held-2")
    with pytest.raises(ProviderIoHeld):
        execution.attempt_start_io(result.attempt.pk)
    attempt = DeliveryAttempt.objects.get(pk=result.attempt.pk)
    assert not attempt.io_may_have_started and attempt.io_started_at is None
