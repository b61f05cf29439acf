"""The V1 -> V2 service cutover up to `v1_drained` against the real V1: preflight and the readiness certificate,
barriers and halt, remeasurement and the fenced abort, stop with receipts, fenced reconciliation, export and the
V1ShutdownCertificate."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from connector.choices import GateMode
from connector.models import AuditRecord, ReceiptAdmissionKey
from connector.services import owners
from cutover.errors import CutoverPhaseRefused, CutoverPreflightRefused, DrainBlocked
from cutover.models import (
    AttemptOutcome,
    CutoverReadinessCertificate,
    MaintenanceBarrierReceipt,
    OrderingBaseline,
    V1GenerationReceipt,
    V1ShutdownCertificate,
)
from cutover.ports import RouteHaltContract
from cutover.services import v1_shutdown as sd
from tests.concurrency import run_concurrently
from tests.cutover.approval_helpers import approve
from tests.cutover.v1_world import ACTOR, BUDGETS, build_v1_world
from v1 import runtime
from v1.errors import V1BarrierClosed
from v1.models import EffectState, V1OutboundEffect
from v1.owner import V1Owner
from tests import dbroles
from tests.support import whole_seconds

TX = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(settings):
    from tests.effects.receiver import Receiver

    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    yield r
    r.stop()


def opened(world, key="att-1"):
    sd.cutover_open(attempt_key=key, configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    certificate = sd.cutover_certify(attempt_key=key, budgets=BUDGETS, actor=ACTOR)
    approve("readiness_certificate", key)
    return certificate


def drained(world, key="att-1"):
    opened(world, key)
    sd.maintenance_close(attempt_key=key, actor=ACTOR)
    runtime.drain(world.generation_id)
    sd.v1_stop(attempt_key=key, actor=ACTOR)
    sd.v1_export(attempt_key=key, actor=ACTOR)
    return sd.v1_certify_drained(attempt_key=key, actor=ACTOR)


@pytest.mark.django_db
def test_preflight_refuses_unsupported_routes_missing_budgets_and_projections_over_budget(provider, monkeypatch):
    """An `unsupported` route or one without a lossless halt contract, a missing budget and a projection over its
    budget each refuse the certificate and write nothing; a certificate is immutable and a changed input needs a
    new attempt with byte-distinct evidence; the certificate gives the route its disposition (`v1_high_water`)
    before maintenance. Proves: CV2-12-012, CV2-12-013, CV2-12-014, CV2-12-017, CV2-12-025, CV2-12-087,
    CV2-12-088, CV2-12-015, CV2-06-017, CV2-06-027"""
    world = build_v1_world()
    sd.cutover_open(attempt_key="att-1", configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    with pytest.raises(CutoverPreflightRefused, match="budgets missing or not positive: full_restore"):
        sd.cutover_certify(attempt_key="att-1", budgets={**BUDGETS, "full_restore": 0}, actor=ACTOR)
    for _ in range(30):
        world.accept(0, f"k{_}", _ + 1)
    with pytest.raises(CutoverPreflightRefused, match="projection drain"):
        sd.cutover_certify(attempt_key="att-1", budgets={**BUDGETS, "drain": 1}, actor=ACTOR)
    bad = RouteHaltContract("records.webhook", False, "unsupported", b"\0" * 32, "")
    monkeypatch.setattr(V1Owner, "route_contracts", lambda self: [bad])
    with pytest.raises(CutoverPreflightRefused) as refused:
        sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)
    assert "unsupported" in refused.value.detail and "lossless" in refused.value.detail
    assert "remediation owner" in refused.value.detail
    assert not CutoverReadinessCertificate.objects.exists()
    monkeypatch.undo()
    certificate = sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)
    assert sd.cutover_certify(attempt_key="att-1", budgets={**BUDGETS, "drain": 999}, actor=ACTOR) == certificate
    assert certificate.routes[0]["disposition"] == "v1_high_water"
    assert set(certificate.reason_map) >= {"V1_DRAIN_BLOCKED", "V1_IO_MAY_HAVE_STARTED"}
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic():  # the trigger, for anyone
        CutoverReadinessCertificate.objects.filter(pk=certificate.pk).update(budgets={})


@pytest.mark.django_db
def test_barriers_halt_every_gate_while_accepted_v1_work_finishes(provider):
    """Closing the barriers stores a receipt per barrier naming the attempt, refuses new V1 roots, and moves every
    frozen gate v1_serving -> halting_v1; accepted V1 work still finishes; V2 stays disabled. Proves: CV2-12-026,
    CV2-12-028, CV2-12-030, CV2-12-031, CV2-12-032"""
    world = build_v1_world()
    world.accept(0, "before", 1)
    opened(world)
    assert sd.maintenance_close(attempt_key="att-1", actor=ACTOR) == 2
    assert sd.maintenance_close(attempt_key="att-1", actor=ACTOR) == 0  # idempotent
    assert world.modes() == {GateMode.HALTING_V1}
    receipts = MaintenanceBarrierReceipt.objects.filter(action="closed")
    assert sorted(receipts.values_list("barrier", flat=True)) == ["authoring", "ingress", "root_outbound"]
    with pytest.raises(V1BarrierClosed):
        world.accept(1, "after", 1)
    runtime.drain(world.generation_id)
    assert provider.applied_total() == 1
    assert AuditRecord.objects.filter(action="gate_halt_v1", reason="service cutover att-1").count() == 2


@pytest.mark.django_db
def test_a_remeasured_breach_takes_the_fenced_abort_before_termination(provider):
    """After the barriers closed, a remeasured workload over the certificate's budgets (a burst that crossed the
    barrier close) aborts at once: barriers reopened, gates back to v1_serving, attempt `aborted`.
    Proves: CV2-12-033, CV2-12-089, CV2-12-018"""
    world = build_v1_world()
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    assert sd.maintenance_remeasure(attempt_key="att-1", actor=ACTOR) == []
    budget = CutoverReadinessCertificate.objects.get().budgets["drain"]
    needed = int(budget / (sd.SECONDS_PER_BACKLOG_ITEM * sd.SAFETY_FACTOR)) + 1
    runtime.V1WorkItem.objects.bulk_create([runtime.V1WorkItem(
        account_key=world.keys[0], source_key="webhook", transport_key=f"x{i}", payload=b"{}",
        payload_digest=b"\0" * 32, partition="p", position=i) for i in range(needed)])
    breaches = sd.maintenance_remeasure(attempt_key="att-1", actor=ACTOR)
    assert breaches and breaches[0].startswith("drain")
    assert world.modes() == {GateMode.V1_SERVING}
    assert sd.attempt_get("att-1").outcome == AttemptOutcome.ABORTED
    assert not V1GenerationReceipt.objects.exists()


@pytest.mark.django_db
def test_abort_restores_v1_serving_and_is_refused_after_termination(provider):
    """The fenced abort reopens the barriers and returns every gate to v1_serving with a new fence; once the V1
    generation was terminated the abort is refused. Proves: CV2-12-034, CV2-12-018"""
    world = build_v1_world()
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    before = {g.account_id: g.fence for g in sd.AccountServingGate.objects.all()}
    assert sd.cutover_abort(attempt_key="att-1", reason="operator", actor=ACTOR) == 2
    after = {g.account_id: (g.mode, g.fence) for g in sd.AccountServingGate.objects.all()}
    assert all(mode == GateMode.V1_SERVING and fence == before[a] + 1 for a, (mode, fence) in after.items())
    assert sd.attempt_get("att-1").outcome == AttemptOutcome.ABORTED
    assert world.accept(0, "again", 1)[1]
    assert MaintenanceBarrierReceipt.objects.filter(action="reopened").count() == 3
    opened(world, "att-2")
    sd.maintenance_close(attempt_key="att-2", actor=ACTOR)
    runtime.drain(world.generation_id)
    sd.v1_stop(attempt_key="att-2", actor=ACTOR)
    with pytest.raises(CutoverPhaseRefused, match="terminated"):
        sd.cutover_abort(attempt_key="att-2", reason="late", actor=ACTOR)


@pytest.mark.django_db
def test_a_closed_authoring_barrier_freezes_the_l2_owner_until_the_abort_reopens_it(provider):
    """While an open attempt's V1 authoring barrier is closed, the L2 owner creates no account and publishes no
    configuration generation (PUBLICATION_BARRIER_HELD, retryable; nothing written); the gate repository keeps
    exactly one gate per frozen account and none for an unknown one. The halting abort reopens the barrier and the
    same account write commits, with its one gate. Proves: CV2-12-024"""
    from connector.models import AccountServingGate, ConnectorAccount, ServiceConfigurationGeneration
    from cutover.errors import PublicationBarrierHeld

    world = build_v1_world()
    opened(world)
    assert sd.l2_frozen_by() is None
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    assert sd.l2_frozen_by() == "att-1"
    counts = (ConnectorAccount.objects.count(), AccountServingGate.objects.count(),
              ServiceConfigurationGeneration.objects.count(), AuditRecord.objects.count())
    with pytest.raises(PublicationBarrierHeld, match="frozen by cutover attempt att-1"):
        owners.account_create(account_key="c-frozen", provider_scope="demo-provider", actor=ACTOR)
    configuration = world.configuration
    with pytest.raises(PublicationBarrierHeld, match="frozen"):
        owners.service_configuration_create(
            generation_id="frozen.g2", catalog_view_key=configuration.catalog_view.view_key,
            catalog_revision=configuration.catalog_view.revision, accounts=[], credential_relation=[], actor=ACTOR)
    assert (ConnectorAccount.objects.count(), AccountServingGate.objects.count(),
            ServiceConfigurationGeneration.objects.count(), AuditRecord.objects.count()) == counts
    keys = set(ConnectorAccount.objects.values_list("account_key", flat=True))
    assert AccountServingGate.objects.filter(account__account_key__in=keys).count() == len(keys)
    assert not AccountServingGate.objects.filter(account__account_key="c-frozen").exists()
    sd.cutover_abort(attempt_key="att-1", reason="operator", actor=ACTOR)
    assert sd.l2_frozen_by() is None
    account = owners.account_create(account_key="c-frozen", provider_scope="demo-provider", actor=ACTOR)
    assert AccountServingGate.objects.filter(account=account).count() == 1


@pytest.mark.django_db
def test_stop_waits_for_the_drain_then_terminates_and_isolates(provider):
    """Stop is refused (DRAIN_BLOCKED, retryable) while accepted V1 work is unfinished; after the drain it stores
    the termination and isolation receipts of the exact generation and moves every gate to v1_stopped.
    Proves: CV2-12-035, CV2-12-037, CV2-12-038, CV2-12-039"""
    world = build_v1_world()
    world.accept(0, "k1", 1)
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    with pytest.raises(DrainBlocked) as blocked:
        sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    assert blocked.value.retryable and "inbound_nonterminal" in blocked.value.detail
    runtime.drain(world.generation_id)
    assert sd.v1_stop(attempt_key="att-1", actor=ACTOR) == 2
    assert world.modes() == {GateMode.V1_STOPPED}
    kinds = dict(V1GenerationReceipt.objects.values_list("kind", "generation_id"))
    assert kinds == {"terminated": world.generation_id, "isolated": world.generation_id}
    generation = V1Owner().current_generation()
    assert generation.state == "terminated" and generation.egress_isolated


@TX
def test_interrupted_io_is_reconciled_in_v1_stopped_before_the_shutdown_certificate(provider, run_child):
    """A V1 worker process killed after its pre-I/O marker leaves the call `io_may_have_started`: stop terminates
    and isolates the generation and enters v1_stopped; certification is refused (DRAIN_BLOCKED) until a fenced
    reconciliation appends evidence and terminalizes the row; a stale fence is refused; after the certificate no
    reconciliation commits; every gate names the certificate digest. Proves: CV2-12-036, CV2-12-040, CV2-12-041,
    CV2-12-042, CV2-12-043, CV2-12-044, CV2-12-045, CV2-12-080, CV2-12-091"""
    world = build_v1_world()
    world.accept(0, "k1", 1)
    world.accept(1, "k2", 4, partition="rec-9")
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    runtime.work_once(world.generation_id)  # k1 finishes
    child = run_child("""
        from v1 import runtime
        runtime.drain(ARGS["generation"])
    """, "v1.after_dispatching", generation=world.generation_id)
    assert child.killed, child.stderr
    assert sd.v1_stop(attempt_key="att-1", actor=ACTOR) == 2
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    with pytest.raises(DrainBlocked, match="io_may_have_started"):
        sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    effect = V1OutboundEffect.objects.get(state=EffectState.DISPATCHING)
    with pytest.raises(CutoverPhaseRefused, match="fences changed"):
        sd.v1_reconcile(attempt_key="att-1", effect_row_id=str(effect.pk), outcome="no_effect", evidence=b"x",
                        reason="stale", expected_fences_digest=b"\0" * 32, actor=ACTOR)
    with transaction.atomic():
        fences = sd.gate_fences_digest(sd.frozen_gates(sd.attempt_get("att-1")))
    sd.v1_reconcile(attempt_key="att-1", effect_row_id=str(effect.pk), outcome="no_effect",
                    evidence=b"provider ledger: key unknown", reason="provider confirmed no request",
                    expected_fences_digest=fences, actor=ACTOR)
    assert provider.applied_total() == 1
    with pytest.raises(DrainBlocked, match="baseline"):
        sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)  # the reconciled item moved its high-water
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    certificate = sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED}
    assert set(AuditRecord.objects.filter(action="gate_certify_drained").values_list("evidence_digest", flat=True)
               ) == {bytes(certificate.digest)}
    assert ReceiptAdmissionKey.objects.filter(tombstone__isnull=False).count() == 2
    assert sorted(OrderingBaseline.objects.values_list("partition", "high_water")) == [("rec-1", 1), ("rec-9", 4)]
    with pytest.raises(CutoverPhaseRefused):
        sd.v1_reconcile(attempt_key="att-1", effect_row_id=str(effect.pk), outcome="no_effect", evidence=b"x",
                        reason="late", expected_fences_digest=None, actor=ACTOR)
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic():  # the trigger, for anyone
        V1ShutdownCertificate.objects.filter(pk=certificate.pk).update(inventory_digest=b"\1" * 32)


@pytest.mark.django_db
def test_certification_rejects_an_account_outside_the_set_and_missing_identities(provider):
    """An account created outside the frozen set, or a V1 transport identity without its tombstone, rejects
    v1_drained and writes nothing. Proves: CV2-12-046, CV2-12-090"""
    world = build_v1_world()
    world.accept(0, "k1", 1)
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    runtime.drain(world.generation_id)
    sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    with pytest.raises(DrainBlocked, match="no exact tombstone"):
        sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    # The L2 owner refuses the account while the authoring barrier is closed (D-291); one written around it (a
    # direct row, as a bypassing writer would) is still caught by the certification.
    from connector.models import AccountServingGate, ConnectorAccount
    stray = ConnectorAccount.objects.create(account_key="c-stray", provider_scope="demo-provider", display_name="x")
    AccountServingGate.objects.create(account=stray)
    with pytest.raises(CutoverPhaseRefused, match="outside the frozen set"):
        sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert not V1ShutdownCertificate.objects.exists() and world.modes() == {GateMode.V1_STOPPED}


@TX
def test_reconciliation_and_certification_serialize_on_the_same_gate_rows(provider, run_child):
    """A reconciliation and a certification racing on separate connections serialize on the v1_stopped gate
    rows: either the reconciliation commits first and the certificate observes it, or the certificate commits
    first and the reconciliation is refused; never a reconciliation after the certificate. Proves: CV2-12-092"""
    world = build_v1_world()
    world.accept(0, "k1", 1)
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    child = run_child("""
        from v1 import runtime
        runtime.drain(ARGS["generation"])
    """, "v1.after_dispatching", generation=world.generation_id)
    assert child.killed
    sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    effect = V1OutboundEffect.objects.get(state=EffectState.DISPATCHING)
    reconcile, certify = run_concurrently(
        [lambda: sd.v1_reconcile(attempt_key="att-1", effect_row_id=str(effect.pk), outcome="remote_finalized",
                                 evidence=b"ledger", reason="provider shows it", expected_fences_digest=None,
                                 actor=ACTOR),
         lambda: sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)],
        expect=Exception)
    outcome = {"reconcile": reconcile, "certify": certify}
    # The certificate needs the reconciliation (the row blocks it) and the export of the item's high-water; it
    # can only succeed after the reconciliation committed, and no reconciliation may commit after it.
    assert not isinstance(outcome["reconcile"], Exception) or isinstance(outcome["certify"], V1ShutdownCertificate)
    if isinstance(outcome["certify"], V1ShutdownCertificate):
        assert isinstance(outcome["reconcile"], Exception)
    else:
        assert isinstance(outcome["certify"], DrainBlocked)
        sd.v1_export(attempt_key="att-1", actor=ACTOR)
        sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED}


@TX
def test_a_crash_while_certifying_leaves_the_service_offline_and_resumable(provider, run_child):
    """A coordinator killed inside the certification transaction (certificate and gate moves written, not
    committed) leaves every gate v1_stopped and no certificate: the service is offline and neither runtime is
    authorized; rerunning certifies. Proves: CV2-12-047, CV2-12-081"""
    world = build_v1_world()
    world.accept(0, "k1", 1)
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    runtime.drain(world.generation_id)
    sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    child = run_child("""
        from connector.actors import Actor
        from cutover.services import v1_shutdown
        v1_shutdown.v1_certify_drained(attempt_key="att-1", actor=Actor.system("coordinator"))
        emit(done=True)
    """, "cutover.certify_before_commit")
    assert child.killed, child.stderr
    assert world.modes() == {GateMode.V1_STOPPED} and not V1ShutdownCertificate.objects.exists()
    generation = V1Owner().current_generation()
    assert generation.state == "terminated" and generation.egress_isolated
    sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED}


@pytest.mark.django_db
def test_an_open_attempt_freezes_its_gates_against_operator_gate_actions(provider):
    """While the attempt is open, a generic V1-path gate action (admin, API, console gate actions) on a frozen gate
    is refused and writes nothing; the coordinator's phases still move them; after the abort the gates are free
    again. Proves: CV2-12-029, CV2-12-034 (only the coordinator moves the frozen gate set)"""
    from connector.errors import TransitionRefused
    from connector.services import gates as gate_services

    world = build_v1_world()
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    gate = sd.AccountServingGate.objects.get(account=world.accounts[0])
    with pytest.raises(TransitionRefused, match="frozen by open service cutover att-1"):
        gate_services.gate_transition(account_id=gate.account_id, action="abort_halt_v1", expected_fence=gate.fence,
                                      actor=ACTOR)
    assert sd.AccountServingGate.objects.get(pk=gate.pk).fence == gate.fence
    sd.cutover_abort(attempt_key="att-1", reason="done", actor=ACTOR)
    moved = gate_services.gate_transition(account_id=gate.account_id, action="halt_v1", expected_fence=None,
                                          actor=ACTOR)
    assert moved.mode == GateMode.HALTING_V1


@pytest.mark.django_db
def test_an_attempt_above_the_declared_activation_maximum_is_refused_at_preflight(settings):
    """A configuration with more accounts than CONNECTOR["ACTIVATION_MAX_ACCOUNTS"] is refused when the attempt
    opens, before any V1 barrier closes: no attempt and no audit row are written. (D-210)"""
    from connector.errors import ActivationCardinalityExceeded
    from cutover.models import ServiceCutoverAttempt

    world = build_v1_world()
    settings.CONNECTOR = {**settings.CONNECTOR, "ACTIVATION_MAX_ACCOUNTS": 1}
    with pytest.raises(ActivationCardinalityExceeded, match="names 2 accounts; the declared maximum is 1"):
        sd.cutover_open(attempt_key="att-max", configuration_generation_id=world.configuration.generation_id,
                        candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    assert not ServiceCutoverAttempt.objects.filter(attempt_key="att-max").exists()
    assert not AuditRecord.objects.filter(action="cutover_open").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("tamper", ["other_attempt", "other_subject", "payload_not_digest"])
def test_owner_receipts_are_verified_in_l0_and_a_foreign_one_moves_nothing(provider, monkeypatch, tamper):
    """Process termination and egress isolation stay facts of the V1 owner: L0 only verifies its receipts,
    provider-neutrally (the exact attempt, the exact owner reference, and the digest of the canonical payload).
    A termination receipt naming another attempt or another generation, or whose payload does not hash to its
    digest, refuses `v1_stop`: no receipt is stored and no gate leaves `halting_v1`. Proves: CV2-12-011"""
    import dataclasses

    world = build_v1_world()
    opened(world)
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    runtime.drain(world.generation_id)
    real = V1Owner.terminate_generation

    def forged(self, generation_id, attempt_key):
        r = real(self, generation_id, attempt_key)
        return {"other_attempt": dataclasses.replace(r, attempt_key="att-other"),
                "other_subject": dataclasses.replace(r, subject="gen-other"),
                "payload_not_digest": dataclasses.replace(r, payload=r.payload + b"x")}[tamper]

    monkeypatch.setattr(V1Owner, "terminate_generation", forged)
    with pytest.raises(CutoverPhaseRefused, match="does not name attempt"):
        sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    assert not V1GenerationReceipt.objects.exists()
    assert world.modes() == {GateMode.HALTING_V1}
