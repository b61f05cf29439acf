"""The operator admin: every fact is browsable and read-only, and every transition it offers goes through the
service layer with the fence the operator saw (STYLE R15).

Runs on real PostgreSQL with both databases (CutoverDecision lives in `journal`). The world is built only
through services (`connector.demo.build_world`).
"""
from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser

import pytest
from django.contrib import admin as django_admin
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from connector import hooks
from connector.actors import Actor
from connector.choices import CredentialGateMode, EpochState, GateMode
from connector.demo import build_owners, build_world, walk_gates_to_validating
from connector.models import (
    AccountServingGate,
    AuditRecord,
    BindingDefinition,
    ConnectorAccount,
    CredentialGeneration,
    CredentialGenerationDispatchGate,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationGeneration,
    ServingEpoch,
)
from connector.services import gates as gate_services
from connector.services import owners as owner_services
from connector.services import serving as serving_services
from cutover.choices import DecisionState
from cutover.models import CutoverDecision

pytestmark = pytest.mark.django_db(databases=["default", "journal"])

EXPECTED_MODELS = {
    ConnectorAccount, PackGeneration, BindingDefinition, IntegrationBindingView, CredentialGeneration,
    ServiceConfigurationGeneration, ServingEpoch, AccountServingGate, CredentialGenerationDispatchGate,
    AuditRecord, CutoverDecision,
}
GATE = "connector.AccountServingGate"


# -- helpers --------------------------------------------------------------------------------------------------

class _Controls(HTMLParser):
    """Named form controls of a page: (tag, type, name)."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("input", "select", "textarea", "button") and a.get("name"):
            self.controls.append((tag, a.get("type") or "", a["name"]))


def controls(html: str) -> list[tuple[str, str, str]]:
    parser = _Controls()
    parser.feed(html)
    return parser.controls


def editable_controls(html: str) -> list[tuple[str, str, str]]:
    """Every control an operator could type into or submit, except the hidden management inputs."""
    return [c for c in controls(html) if not (c[0] == "input" and c[1] == "hidden")]


def post(client, path: str, data: dict):
    """POST as a browser does: follow the redirect, so the page that shows the messages is rendered."""
    return client.post(path, data, follow=True)


def flashed(response) -> list[tuple[int, str]]:
    """The messages the followed page rendered (each request's messages are consumed by its page)."""
    return [(m.level, m.message) for m in response.context["messages"]]


def buttons(html: str) -> dict[str, bool]:
    """Transition buttons of a detail page: name -> enabled."""
    return {name: not disabled for name, disabled in
            re.findall(r'<button type="submit" name="transition" value="([a-z0-9_]+)"[^>]*?( disabled)?>', html)}


def url(obj, view: str = "change") -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_{view}", args=[obj.pk])


def changelist(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def gate_of(world, index: int = 0) -> AccountServingGate:
    return AccountServingGate.objects.get(account=world.accounts[index])


def shown_fence(html: str) -> int:
    match = re.search(r'name="expected_fence" value="(\d+)"', html)
    assert match, "the transition form carries the fence the page showed"
    return int(match.group(1))


def audit_table(html: str) -> str:
    """The audit trail table of a detail page."""
    return html[html.index('<table class="cv2-table"><thead><tr><th>at</th>'):]


def gate_audit_count(gate) -> int:
    return AuditRecord.objects.filter(entity_type=GATE, entity_id=str(gate.pk)).count()


def one_of_each(world) -> dict:
    decision = CutoverDecision.objects.create(attempt_key="adm-attempt-1")  # no cutover service writes it yet
    gate = CredentialGenerationDispatchGate.objects.get(
        credential_generation__generation_id=world.credential_generation_ids[0])
    return {
        ConnectorAccount: world.accounts[0], PackGeneration: world.packs[0],
        BindingDefinition: BindingDefinition.objects.filter(pack_generation=world.packs[0]).first(),
        IntegrationBindingView: world.view, CredentialGeneration: gate.credential_generation,
        ServiceConfigurationGeneration: world.configuration, ServingEpoch: world.active_epoch,
        AccountServingGate: gate_of(world), CredentialGenerationDispatchGate: gate,
        AuditRecord: AuditRecord.objects.order_by("pk").first(), CutoverDecision: decision,
    }


@pytest.fixture
def world():
    return build_world("adm-")


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("operator", "operator@example.com", "unused")
    client.force_login(user)
    return user


# -- browsing -------------------------------------------------------------------------------------------------

def test_every_fact_model_is_registered():
    """The admin registers every connector fact and the journal's CutoverDecision, so an operator can see every
    owner generation, epoch, gate and credential gate."""
    from django.apps import apps

    registered = {m for m in django_admin.site._registry if m._meta.app_label in ("connector", "cutover")}
    assert EXPECTED_MODELS <= registered
    inline_models = {inline.model for admin_obj in django_admin.site._registry.values()
                     for inline in admin_obj.inlines}
    every_model = {m for app in ("connector", "cutover") for m in apps.get_app_config(app).get_models()}
    assert every_model - registered - inline_models == set(), "every fact has an admin page or an inline"


def test_every_changelist_and_one_change_page_per_model_render(client, operator, world):
    """Each changelist (plain, searched, filtered) and one change page per model return 200, including
    CutoverDecision read from the journal database; each changelist explains what the fact is and who owns it."""
    for model, obj in one_of_each(world).items():
        response = client.get(changelist(model))
        assert response.status_code == 200, model
        assert 'class="cv2-description"' in response.content.decode(), model
        assert client.get(changelist(model), {"q": "adm"}).status_code == 200, model
        response = client.get(url(obj))
        assert response.status_code == 200, model
        assert str(obj) in response.content.decode() or model is AuditRecord
    assert client.get(changelist(AccountServingGate), {"mode__exact": GateMode.V2_SERVING}).status_code == 200
    assert client.get(changelist(ServingEpoch), {"state__exact": EpochState.VERIFIED}).status_code == 200


def test_gate_changelist_shows_mode_fence_and_epoch(client, operator, world):
    """The gate list shows each gate's mode badge, fence and exact epoch (ID and short digest)."""
    html = client.get(changelist(AccountServingGate)).content.decode()
    assert 'cv2-badge cv2-tone-ok">v2_serving<' in html
    assert world.active_epoch.epoch_id in html
    assert bytes(world.active_epoch.digest)[:6].hex() in html
    assert re.search(r'<td class="field-fence">6</td>', html)


def test_changelists_do_not_query_per_row(client, operator, world):
    """The account, gate, credential and epoch changelists load their related rows with the list query
    (`list_select_related`): more rows cost no more queries."""
    pages = [changelist(m) for m in (ConnectorAccount, AccountServingGate, CredentialGeneration,
                                     CredentialGenerationDispatchGate, ServingEpoch, AuditRecord)]

    def counts() -> list[int]:
        result = []
        for page in pages:
            with CaptureQueriesContext(connection) as queries:
                assert client.get(page).status_code == 200
            result.append(len(queries))
        return result

    before = counts()
    for index in range(3):
        account = owner_services.account_create(account_key=f"adm-extra-{index}", provider_scope="demo-provider",
                                                actor=Actor.system("test"))
        owner_services.credential_generation_create(
            generation_id=f"adm-extra-{index}.crm-api.g1", credential_identity="crm-api",
            account_key=account.account_key, secret=b"s", transport_config={"timeout_ms": 1},
            actor=Actor.system("test"))
    assert counts() == before


def test_digests_and_receipts_render_as_lowercase_hex_and_no_secret_appears(client, operator, world):
    """Digests appear in full lowercase hex; receipts are truncated in lists and complete in a monospace <pre>
    on the detail page; secret bytes never appear, only the secret version reference. Proves: CV2-02-021"""
    pack = world.packs[0]
    listing = client.get(changelist(PackGeneration)).content.decode()
    assert bytes(pack.payload_digest).hex() in listing
    assert bytes(pack.receipt)[:16].hex() + "…" in listing
    assert bytes(pack.receipt).hex() not in listing
    detail = client.get(url(pack)).content.decode()
    assert bytes(pack.receipt_digest).hex() in detail
    assert f'<pre class="cv2-hex">{bytes(pack.receipt).hex()}</pre>' in detail

    generation = CredentialGeneration.objects.get(generation_id=world.credential_generation_ids[0])
    detail = client.get(url(generation)).content.decode()
    secret = hashlib.sha256(f"demo-secret:{generation.generation_id}".encode()).hexdigest()
    assert secret not in detail and secret.encode().hex() not in detail
    assert generation.secret_version_ref in detail
    assert bytes(generation.transport_config_digest).hex() in detail


def test_epoch_detail_shows_decoded_preimage_rejection_and_audit_trail(client, operator, world):
    """The ServingEpoch page shows the full digest, the preimage decoded as an indented tree (bytes as hex) and
    in raw hex, and the epoch's audit trail newest first."""
    epoch = world.active_epoch
    html = client.get(url(epoch)).content.decode()
    assert bytes(epoch.digest).hex() in html
    assert "domain: &quot;" in html and "record (" in html and "  bindings: list (4)" in html
    assert bytes(epoch.serving_scope_digest).hex() in html
    assert f'<pre class="cv2-hex">{bytes(epoch.preimage).hex()}</pre>' in html
    trail = audit_table(html)
    assert trail.index("epoch_activate_first") < trail.index("epoch_verify") < trail.index("epoch_prepare")


# -- read-only facts ------------------------------------------------------------------------------------------

def test_change_pages_have_no_editable_fields_and_a_posted_change_alters_nothing(client, operator, world):
    """Every change page opens read-only: no editable control for any field (only the transition form's reason
    on epoch and gate pages), and a POSTed edit is refused with 403 and leaves the row as it was."""
    for model, obj in one_of_each(world).items():
        html = client.get(url(obj)).content.decode()
        editable = set(editable_controls(html))
        if model in (ServingEpoch, AccountServingGate, CredentialGenerationDispatchGate):
            editable -= {("textarea", "", "reason"), ("button", "submit", "transition")}  # the transition form
        assert not editable, (model, editable)
        field_names = {f.name for f in model._meta.concrete_fields}
        assert not {name for _, _, name in controls(html)} & field_names, model
        assert 'name="_save"' not in html

    pack = world.packs[0]
    before = PackGeneration.objects.values().get(pk=pack.pk)
    response = client.post(url(pack), {"generation_id": "tampered", "owner_pack": "tampered", "_save": "Save"})
    assert response.status_code == 403
    assert PackGeneration.objects.values().get(pk=pack.pk) == before

    gate = gate_of(world)
    response = client.post(url(gate), {"mode": GateMode.HALTING_V2, "fence": 99, "_save": "Save"})
    assert response.status_code == 403
    assert (gate_of(world).mode, gate_of(world).fence) == (GateMode.V2_SERVING, 6)


def test_add_and_delete_are_not_offered(client, operator, world):
    """No fact can be added or deleted from the admin: no add or delete link, no bulk delete action, and the
    add and delete URLs refuse."""
    for model, obj in one_of_each(world).items():
        listing = client.get(changelist(model)).content.decode()
        assert "delete_selected" not in listing, model
        add = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_add")
        assert f'href="{add}"' not in listing, model
        detail = client.get(url(obj)).content.decode()
        assert 'class="deletelink"' not in detail, model
        assert client.get(url(obj, "delete")).status_code == 403, model
        assert client.post(url(obj, "delete"), {"post": "yes"}).status_code == 403, model
        assert client.get(add).status_code == 403, model
        assert model.objects.filter(pk=obj.pk).exists()


# -- gate transitions -----------------------------------------------------------------------------------------

def test_gate_transition_through_the_admin_advances_the_fence_and_writes_an_audit_record(client, operator, world):
    """The detail page offers the allowed transitions with the fence it shows; posting one moves the gate
    through gate_transition, advances the fence by one and writes an audit row naming the operator.
    Proves: CV2-03-009, CV2-03-013"""
    gate = gate_of(world)
    page = client.get(url(gate)).content.decode()
    assert buttons(page) == {"halt_v2": True}
    fence = shown_fence(page)
    assert fence == gate.fence == 6

    response = post(client, url(gate, "transition"), {"transition": "halt_v2", "expected_fence": fence,
                                                     "reason": "maintenance window"})
    assert response.redirect_chain == [(url(gate), 302)]
    assert (messages.SUCCESS, f"gate {gate.account}: halt_v2 applied, v2_serving → halting_v2, fence now 7") \
        in flashed(response)
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (GateMode.HALTING_V2, 7)
    record = AuditRecord.objects.filter(entity_type=GATE, entity_id=str(gate.pk)).order_by("-pk").first()
    assert (record.action, record.from_state, record.to_state, record.fence, record.actor, record.reason) == (
        "gate_halt_v2", GateMode.V2_SERVING, GateMode.HALTING_V2, 7, "user:operator", "maintenance window")

    page = client.get(url(gate)).content.decode()
    trail = audit_table(page)
    assert trail.index("gate_halt_v2") < trail.index("gate_activate_first")
    assert shown_fence(page) == 7


def test_a_stale_page_is_refused_with_fence_stale_and_changes_nothing(client, operator, world):
    """Submitting a transition from a page that showed an older fence is refused with FENCE_STALE: the gate,
    its fence and its audit trail stay as they are. Proves: CV2-03-013"""
    gate = gate_of(world)
    stale = shown_fence(client.get(url(gate)).content.decode())
    gate_services.gate_transition(account_id=gate.account_id, action="halt_v2", expected_fence=stale,
                                  actor=Actor.system("other-operator"))
    audits = gate_audit_count(gate)

    response = post(client, url(gate, "transition"), {"transition": "halt_v2", "expected_fence": stale})
    errors = [m for level, m in flashed(response) if level == messages.ERROR]
    assert len(errors) == 1 and errors[0].startswith("FENCE_STALE: ")
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (GateMode.HALTING_V2, 7)
    assert gate_audit_count(gate) == audits

    response = post(client, url(gate, "transition"), {"transition": "confirm_halted"})
    assert [m for level, m in flashed(response) if level == messages.ERROR][0].startswith("FENCE_STALE: ")
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (GateMode.HALTING_V2, 7)


def test_a_refused_transition_shows_transition_refused_and_changes_nothing(client, operator, world):
    """halt_v1 on a v2_serving gate is refused with TRANSITION_REFUSED, from the detail form and from the
    changelist action alike, and writes nothing. Proves: CV2-03-013"""
    gate = gate_of(world)
    audits = gate_audit_count(gate)
    response = post(client, url(gate, "transition"), {"transition": "halt_v1", "expected_fence": gate.fence})
    assert (messages.ERROR, "TRANSITION_REFUSED: halt_v1 is not allowed from v2_serving") in flashed(response)

    response = post(client, changelist(AccountServingGate), {
        "action": "gate_halt_v1", "_selected_action": [gate.pk], "post": "yes", f"fence_{gate.pk}": gate.fence})
    assert (messages.ERROR, f"TRANSITION_REFUSED: halt_v1 is not allowed from v2_serving (gate {gate.account})") \
        in flashed(response)
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (GateMode.V2_SERVING, 6)
    assert gate_audit_count(gate) == audits


def test_changelist_gate_action_confirms_with_the_fences_shown(client, operator, world):
    """A changelist gate action first shows a confirmation page carrying each gate's fence; confirming applies
    the transition per gate with that fence (one audit row each), and a confirmation whose fence is stale is
    refused per gate. Proves: CV2-03-013"""
    first, second = gate_of(world, 0), gate_of(world, 1)
    response = client.post(changelist(AccountServingGate), {
        "action": "gate_halt_v2", "_selected_action": [first.pk, second.pk], "index": 0})
    assert response.status_code == 200 and response.templates[0].name == "admin/cv2/confirm_action.html"
    html = response.content.decode()
    assert f'name="fence_{first.pk}" value="6"' in html and f'name="fence_{second.pk}" value="6"' in html

    response = post(client, changelist(AccountServingGate), {
        "action": "gate_halt_v2", "_selected_action": [first.pk, second.pk], "post": "yes",
        f"fence_{first.pk}": 6, f"fence_{second.pk}": 5, "reason": "bulk halt"})
    assert response.redirect_chain[0][1] == 302
    levels = [level for level, _ in flashed(response)]
    assert levels.count(messages.SUCCESS) == 1 and levels.count(messages.ERROR) == 1
    assert any(m.startswith("FENCE_STALE: ") for _, m in flashed(response))
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.mode, first.fence) == (GateMode.HALTING_V2, 7)
    assert (second.mode, second.fence) == (GateMode.V2_SERVING, 6)
    assert AuditRecord.objects.filter(entity_type=GATE, entity_id=str(first.pk), action="gate_halt_v2",
                                      reason="bulk halt").count() == 1


def test_gate_detail_shows_blockers_and_a_blocked_transition_is_refused(client, operator, world, monkeypatch):
    """While a halt blocker reports open permits, the gate page lists it and disables confirm_halted; posting
    it anyway is refused with TRANSITION_REFUSED naming the blocker, and nothing changes.
    Proves: CV2-03-010"""
    monkeypatch.setattr(hooks, "_HALT_BLOCKERS", [lambda gate: ["2 open permits"]])
    gate = gate_of(world)
    gate_services.gate_transition(account_id=gate.account_id, action="halt_v2", expected_fence=6,
                                  actor=Actor.system("test"))
    html = client.get(url(gate)).content.decode()
    assert "2 open permits" in html
    assert re.search(r'value="confirm_halted"[^>]*disabled', html)
    assert 'value="abort_halt_v1"' not in html

    response = post(client, url(gate, "transition"), {"transition": "confirm_halted", "expected_fence": 7})
    assert (messages.ERROR, "TRANSITION_REFUSED: confirm_halted is blocked: 2 open permits") in flashed(response)
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (GateMode.HALTING_V2, 7)


def test_gate_transition_needs_the_operate_permission(client, world):
    """A staff user who may only view gates sees them but cannot move one: PERMISSION_REFUSED, nothing
    written."""
    user = get_user_model().objects.create_user("viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_accountservinggate"))
    client.force_login(user)
    gate = gate_of(world)
    assert client.get(url(gate)).status_code == 200
    response = post(client, url(gate, "transition"), {"transition": "halt_v2", "expected_fence": 6})
    assert flashed(response)[0][1].startswith("PERMISSION_REFUSED: ")
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (GateMode.V2_SERVING, 6)


# -- credential gates -----------------------------------------------------------------------------------------

def test_credential_gate_revoke_and_explicit_reenable_through_the_admin(client, operator, world):
    """Revocation and re-enablement go through credential_gate_transition with the fence shown; re-enabling
    without a reason is refused; each transition advances the fence and never touches the generation.
    Proves: CV2-04-001, CV2-04-002, CV2-04-004, CV2-04-005"""
    gate = CredentialGenerationDispatchGate.objects.get(
        credential_generation__generation_id=world.credential_generation_ids[0])
    generation_before = CredentialGeneration.objects.values().get(pk=gate.credential_generation_id)
    fence = shown_fence(client.get(url(gate)).content.decode())
    response = post(client, url(gate, "transition"), {"transition": "revoke", "expected_fence": fence})
    assert flashed(response)[0][0] == messages.SUCCESS
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (CredentialGateMode.REVOKED, 2)

    response = post(client, url(gate, "transition"), {"transition": "reenable", "expected_fence": 2, "reason": " "})
    assert flashed(response)[0] == (messages.ERROR, "TRANSITION_REFUSED: re-enablement is an explicit authorized "
                                                    "decision and needs a reason")
    response = post(client, changelist(CredentialGenerationDispatchGate), {
        "action": "reenable_gates", "_selected_action": [gate.pk], "post": "yes", f"fence_{gate.pk}": 2,
        "reason": "rotation rolled back"})
    assert flashed(response)[0][0] == messages.SUCCESS
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (CredentialGateMode.ENABLED, 3)
    assert CredentialGeneration.objects.values().get(pk=gate.credential_generation_id) == generation_before
    actions = list(AuditRecord.objects.filter(entity_type="connector.CredentialGenerationDispatchGate",
                                              entity_id=str(gate.pk)).values_list("action", flat=True))
    assert actions[:2] == ["credential_gate_reenable", "credential_gate_revoke"]


def test_credential_gate_transition_without_permission_is_refused(client, world):
    """A staff user lacking the revoke permission gets PERMISSION_REFUSED from the service; nothing changes.
    Proves: CV2-04-002, CV2-04-004"""
    user = get_user_model().objects.create_user("viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_credentialgenerationdispatchgate"))
    client.force_login(user)
    gate = CredentialGenerationDispatchGate.objects.get(
        credential_generation__generation_id=world.credential_generation_ids[0])
    response = post(client, url(gate, "transition"), {"transition": "revoke", "expected_fence": gate.fence})
    assert flashed(response) == [(messages.ERROR, "PERMISSION_REFUSED: user:viewer may not revoke")]
    gate.refresh_from_db()
    assert (gate.mode, gate.fence) == (CredentialGateMode.ENABLED, 1)


# -- epochs ---------------------------------------------------------------------------------------------------

def test_epoch_actions_go_through_the_serving_services(client, operator, world):
    """Verify refuses an epoch that is not prepared, first activation refuses while the gates serve, and the
    operator's rejection needs a reason, then rejects the verified candidate with an audit row.
    Proves: CV2-02-006"""
    candidate = world.verified_epoch
    response = post(client, changelist(ServingEpoch), {"action": "verify_epochs", "_selected_action": [candidate.pk],
                                                       "index": 0})
    assert flashed(response)[0][1].startswith("TRANSITION_REFUSED: ")
    response = post(client, url(candidate, "transition"), {"transition": "activate_first"})
    assert flashed(response)[0][1].startswith("TRANSITION_REFUSED: every gate must be v2_validating")

    response = client.post(changelist(ServingEpoch), {"action": "reject_epochs", "_selected_action": [candidate.pk],
                                                      "index": 0})
    assert response.status_code == 200 and 'name="reason"' in response.content.decode()
    response = post(client, changelist(ServingEpoch), {"action": "reject_epochs", "_selected_action": [candidate.pk],
                                                       "post": "yes", "reason": ""})
    assert flashed(response)[0] == (messages.ERROR, f"TRANSITION_REFUSED: a rejection needs a reason "
                                                    f"(epoch {candidate.epoch_id})")
    candidate.refresh_from_db()
    assert candidate.state == EpochState.VERIFIED

    response = post(client, changelist(ServingEpoch), {"action": "reject_epochs", "_selected_action": [candidate.pk],
                                                       "post": "yes", "reason": "superseded"})
    assert flashed(response)[0][0] == messages.SUCCESS
    candidate.refresh_from_db()
    assert (candidate.state, candidate.rejection_code, candidate.rejection_detail) == (
        EpochState.REJECTED, "OPERATOR_REJECTED", "superseded")
    assert AuditRecord.objects.filter(entity_type="connector.ServingEpoch", entity_id=str(candidate.pk),
                                      action="epoch_reject", actor="user:operator").exists()
    html = client.get(url(candidate)).content.decode()
    assert "OPERATOR_REJECTED" in html and "superseded" in html

    response = post(client, url(world.active_epoch, "transition"), {"transition": "reject", "reason": "no"})
    assert flashed(response)[0][1].startswith("TRANSITION_REFUSED: ")
    assert ServingEpoch.objects.get(pk=world.active_epoch.pk).state == EpochState.ACTIVE


def test_epoch_verify_and_first_activation_through_the_admin(client, operator):
    """A prepared epoch is verified by fresh owner reads from the admin action, and the detail page's
    first-activation button activates it and moves every gate of the configuration to v2_serving on it, each
    with a new fence and an audit row by the operator. Proves: CV2-02-028, CV2-02-030, CV2-03-013"""
    world = build_owners("adm-")
    epoch = serving_services.epoch_prepare_from_owners(
        epoch_id="adm-epoch-9", configuration_generation_id=world.configuration.generation_id,
        actor=Actor.system("test"))
    response = post(client, changelist(ServingEpoch), {"action": "verify_epochs", "_selected_action": [epoch.pk],
                                                       "index": 0})
    assert flashed(response) == [(messages.SUCCESS, "epoch adm-epoch-9: verify applied, prepared → verified")]

    walk_gates_to_validating(world, Actor.system("test"))
    page = client.get(url(epoch)).content.decode()
    assert buttons(page) == {"verify": False, "activate_first": True, "reject": True, "retire": False}
    response = post(client, url(epoch, "transition"), {"transition": "activate_first"})
    assert flashed(response) == [(messages.SUCCESS, "epoch adm-epoch-9: activate_first applied, verified → active")]
    epoch.refresh_from_db()
    assert epoch.state == EpochState.ACTIVE
    for account in world.accounts:
        gate = AccountServingGate.objects.get(account=account)
        assert (gate.mode, gate.epoch_id, gate.fence) == (GateMode.V2_SERVING, epoch.pk, 6)
        assert AuditRecord.objects.filter(entity_type=GATE, entity_id=str(gate.pk), action="gate_activate_first",
                                          actor="user:operator", fence=6).exists()


# -- journal --------------------------------------------------------------------------------------------------

def test_cutover_decision_is_read_from_the_journal_database_and_read_only(client, operator):
    """CutoverDecision (journal database) lists and opens in the admin, read-only; a POSTed edit is refused."""
    decision = CutoverDecision.objects.create(attempt_key="adm-attempt-2")
    assert CutoverDecision.objects.using("journal").filter(pk=decision.pk).exists()
    assert "adm-attempt-2" in client.get(changelist(CutoverDecision)).content.decode()
    html = client.get(url(decision)).content.decode()
    assert "rollback_open" in html and "choose_activation" in html
    response = client.post(url(decision), {"state": DecisionState.V2_COMMITTED, "fence": 9})
    assert response.status_code == 403
    decision.refresh_from_db()
    assert (decision.state, decision.fence) == (DecisionState.ROLLBACK_OPEN, 1)
