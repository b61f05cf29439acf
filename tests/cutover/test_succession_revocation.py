"""An urgent credential revocation against a V2 -> V2 succession (CV2-11-042): before the successor's local
activation transaction it aborts the activation (the held barrier set is released, before or after the handoffs)
and applies; once `activation_committed` is recorded it waits (refused, retryable, nothing changes) until the
activation is read back and the set released, then applies.

Proves: CV2-11-042
"""
from __future__ import annotations

import pytest

from connector.choices import GateMode
from connector.models import AuditRecord, CredentialGenerationDispatchGate
from connector.services import gates as gate_services
from cutover.choices import BarrierSetState
from cutover.errors import PublicationBarrierHeld, SuccessorActivationRefused
from cutover.models import ServingPublicationBarrierSet
from cutover.services import succession
from tests.cutover.succession_helpers import (
    ACTOR,
    build_succession_world,
    drain,
    gate_modes,
    halt_all,
    handoff_all,
    held_barrier,
    send,
    state_of,
)


@pytest.fixture
def sworld(db):
    world = build_succession_world("rv-")
    send(world, "evt-1", 10)
    drain()
    return world


def _generation_id(world) -> str:
    return world.configuration.credential_mappings.first().credential_generation.generation_id


def _credential_gate(world) -> tuple[str, int]:
    gate = CredentialGenerationDispatchGate.objects.get(credential_generation__generation_id=_generation_id(world))
    return gate.mode, gate.fence


def _revoke(world):
    return gate_services.credential_gate_transition(generation_id=_generation_id(world), action="revoke",
                                                    expected_fence=None, actor=ACTOR, reason="key leaked")


@pytest.mark.parametrize("handed_off", [False, True], ids=["before-handoffs", "after-handoffs"])
def test_a_revocation_before_the_activation_transaction_aborts_it_and_applies(sworld, handed_off):
    """Held set, gates halted, with or without the handoffs: the revocation commits, the set is released (after
    the handoffs as the candidate's release: every gate stays v2_halted), and the activation is then refused with
    nothing moved."""
    halt_all(sworld)
    barrier = held_barrier(sworld)
    if handed_off:
        assert handoff_all(sworld, barrier)
    before = _credential_gate(sworld)
    _revoke(sworld)
    mode, fence = _credential_gate(sworld)
    assert mode != before[0] and fence == before[1] + 1
    row = ServingPublicationBarrierSet.objects.get(pk=barrier.pk)
    assert row.state == BarrierSetState.RELEASED and "urgent revocation" in row.release_reason
    audit = AuditRecord.objects.filter(entity_id=str(barrier.pk), action="barrier_set_release").get()
    assert ("replacement" in audit.reason) is handed_off
    assert gate_modes(sworld) == {GateMode.V2_HALTED}
    moved = state_of(sworld)
    with pytest.raises(SuccessorActivationRefused, match="needs a held barrier set"):
        succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=None, actor=ACTOR)
    assert state_of(sworld) == moved


def test_once_activation_committed_a_revocation_waits_for_readback_and_release(sworld):
    """After the successor's activation transaction recorded `activation_committed`, the revocation is refused
    (retryable; the credential gate keeps its mode and fence, the set stays committed); after the readback and
    the release it applies."""
    halt_all(sworld)
    barrier = held_barrier(sworld)
    handoff_all(sworld, barrier)
    succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=None, actor=ACTOR)
    committed = ServingPublicationBarrierSet.objects.get(pk=barrier.pk)
    assert committed.state == BarrierSetState.ACTIVATION_COMMITTED
    before = _credential_gate(sworld)
    with pytest.raises(PublicationBarrierHeld):
        _revoke(sworld)
    assert _credential_gate(sworld) == before
    assert ServingPublicationBarrierSet.objects.get(pk=barrier.pk).state == BarrierSetState.ACTIVATION_COMMITTED
    succession.barrier_set_release(barrier_set_pk=barrier.pk, expected_fence=committed.fence,
                                   reason="activation read back", actor=ACTOR)
    _revoke(sworld)
    mode, fence = _credential_gate(sworld)
    assert mode != before[0] and fence == before[1] + 1
    assert gate_modes(sworld) == {GateMode.V2_SERVING}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_a_revocation_racing_the_activation_transaction_either_aborts_it_or_waits_for_it(round_):
    """The revocation and `successor_activate` on two connections released together: exactly one order wins. The
    revocation first: it commits, the set is released and the activation is refused with every gate still
    v2_halted. The activation first: it commits `activation_committed` with every gate v2_serving and the
    revocation is refused (retryable), the credential gate unchanged. Never both, never neither, no deadlock."""
    from tests.concurrency import run_concurrently

    world = build_succession_world(f"rr{round_}-")
    send(world, "evt-1", 10)
    drain()
    halt_all(world)
    barrier = held_barrier(world)
    handoff_all(world, barrier)
    before = _credential_gate(world)
    activated, revoked = run_concurrently(
        [lambda: succession.successor_activate(barrier_set_pk=barrier.pk, expected_fence=None, actor=ACTOR),
         lambda: _revoke(world)],
        expect=(SuccessorActivationRefused, PublicationBarrierHeld))
    state = ServingPublicationBarrierSet.objects.get(pk=barrier.pk).state
    if isinstance(revoked, PublicationBarrierHeld):
        assert not isinstance(activated, Exception) and state == BarrierSetState.ACTIVATION_COMMITTED
        assert gate_modes(world) == {GateMode.V2_SERVING} and _credential_gate(world) == before
    else:
        assert isinstance(activated, SuccessorActivationRefused) and state == BarrierSetState.RELEASED
        assert gate_modes(world) == {GateMode.V2_HALTED} and _credential_gate(world)[1] == before[1] + 1
