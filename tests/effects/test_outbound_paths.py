"""Outbound request paths: one builder percent-encodes every value into exactly one segment of the frozen
callout template; a value that would change the path's structure is refused at authoring (OUTBOUND_PATH_UNSAFE)
and Runtime records the item `rejected` without keeping any of it; a template outside the grammar is refused
when the binding is installed or read; the egress adapter never sends a frozen path outside its template, not
even one written by older code; and every OutboundCommand names the Execution that authored it."""
from __future__ import annotations

import json
import posixpath
from urllib.parse import unquote, urlsplit
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.actors import Actor
from connector.choices import BindingKind
from connector.errors import CalloutTemplateInvalid, OwnerFactInvalid
from connector.interpreters.callout import PathValueUnsafe, build_path, parse_template, path_fits_template
from connector.models import ApplicationResult, BindingDefinition, CrmRecord, Execution, PackGeneration
from connector.selectors.owners import binding_definition_read
from connector.services import admission, execution, materialize, owners
from effects.errors import OutboundPathUnsafe
from effects.models import DispatchPermit, OutboundCommand, RemoteEffect, RemoteEffectAttempt
from tests.effects.helpers import acquire, author, claim, force, send

TEMPLATE = "/v1/records/{record_key}"  # the demo callout's frozen template
HOSTILE = [
    "inj/../../admin?x=1#f",  # the record id: was sent as /v1/admin?x=1
    "a/b", "..", ".", "", "x?y=1", "x#frag", "a\\b",
    "%2F", "a%2fb", "%252F", "%2e%2e", "%2E", "%3F", "%23", "%5C",
    "\uff0f", "\uff0e\uff0e", "\u2024\u2024",  # fullwidth solidus / full stops, one-dot leaders (NFKC)
    "a\x00b", "a\nb", "a\rb", "a\tb", "\x7f", "\u0085", "\u202e", "\u2028", "%00", "%0D%0A", "%FF",
]
SAFE = {"r1": "r1", "a b": "a%20b", "50%": "50%25", "%25": "%2525", "caf\u00e9": "caf%C3%A9", "ok;x=1": "ok%3Bx%3D1",
        "\u30ec\u30b3\u30fc\u30c9": "%E3%83%AC%E3%82%B3%E3%83%BC%E3%83%89", "~a_b-c.d": "~a_b-c.d"}


def _event_body(record_id: str, n: int = 1) -> bytes:
    return json.dumps({"events": [{"id": f"e-{n}", "type": "record.updated", "record_id": record_id, "sequence": 1,
                                   "occurred_at": "2025-01-01T00:00:00Z",
                                   "data": {"name": "Ann", "email": "ann@example.com"}}]}).encode()


def _run_event(account, record_id: str, n: int) -> Execution:
    """Admit one event for `record_id`, materialize it, mint and run its Execution (the production steps)."""
    adm = admission.receipt_admit(account_key=account.account_key, channel="records.webhook",
                                  transport_key=f"k-{n}", body=_event_body(record_id, n), actor=Actor.system("t"))
    out = materialize.receipt_materialize(receipt_pk=adm.receipt.pk)
    for lane in out.lanes:
        execution.lane_advance(lane_pk=lane)
    token = execution.execution_claim(holder="w", account_id=account.pk)
    assert token is not None
    return execution.execution_run(token=token)


def _dispatch_all(holder: str = "h1") -> None:
    while RemoteEffect.objects.filter(state="prepared").exists():
        ready = acquire(holder)
        send(ready)


# -- the builder ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", HOSTILE)
def test_a_value_that_would_change_the_path_is_refused(value):
    """Every path-structure-changing value (separator, dot segment, query, fragment, backslash, empty, control or
    format character, or a percent-encoded / NFKC form of one) is refused by the one builder. Proves: CV2-10-006,
    CV2-10-009"""
    with pytest.raises(PathValueUnsafe):
        build_path(TEMPLATE, {"record_key": value})


@pytest.mark.parametrize("value,encoded", sorted(SAFE.items()))
def test_a_safe_value_is_percent_encoded_into_one_opaque_segment(value, encoded):
    """An accepted value is UTF-8 percent-encoded (everything but unreserved characters, `%` as `%25`) into one
    segment, and the frozen path fits its template. Proves: CV2-10-006"""
    path = build_path(TEMPLATE, {"record_key": value})
    assert path == "/v1/records/" + encoded
    assert path_fits_template(TEMPLATE, path) is None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=40) | st.from_regex(r"[a-z%./?#\\0-9A-F]{0,12}", fullmatch=True))
def test_no_value_builds_a_path_outside_the_template(value):
    """Property: for any text, the builder either refuses it, or the URL a server sees — parsed, percent-decoded
    and dot-normalised — is `/v1/records/<one segment>` with no query or fragment, that segment is the value, and
    the path fits the template. Proves: CV2-10-006, CV2-10-036"""
    try:
        path = build_path(TEMPLATE, {"record_key": value})
    except PathValueUnsafe:
        return
    url = urlsplit("http://crm.example" + path)
    assert (url.netloc, url.query, url.fragment) == ("crm.example", "", "")
    served = posixpath.normpath(unquote(url.path))
    assert served.split("/")[:3] == ["", "v1", "records"] and served.count("/") == 3
    assert unquote(url.path.rsplit("/", 1)[1]) == value
    assert path_fits_template(TEMPLATE, path) is None


@pytest.mark.parametrize("template", [
    "http://crm.example/v1/{id}", "//crm.example/{id}", "v1/{id}", "/v1/x{id}", "/v1/{id}.json", "/v1/{id}/{id}",
    "/v1/{id}#frag", "/v1/../admin/{id}", "/v1//{id}", "/v1/{id}?q=a{b}", "/v1/{a b}", "/v1/{id}?{k}=v", "",
])
def test_a_template_outside_the_grammar_is_refused(template):
    """A template that puts a placeholder in the scheme/host or inside a segment, or has dot/empty segments or
    a fragment, is refused with CALLOUT_TEMPLATE_INVALID. Proves: CV2-10-009"""
    with pytest.raises(CalloutTemplateInvalid) as refused:
        parse_template(template)
    assert refused.value.code == "CALLOUT_TEMPLATE_INVALID"


@pytest.mark.django_db
def test_installing_a_callout_with_an_invalid_template_is_refused_and_writes_nothing():
    """pack_generation_install reads back what it wrote through the owner reader: a callout profile whose
    template fills part of a segment is refused (CALLOUT_TEMPLATE_INVALID, an OWNER_FACT_INVALID) and nothing is
    installed. Proves: CV2-02-001"""
    with pytest.raises(CalloutTemplateInvalid):
        owners.pack_generation_install(
            generation_id="bad-callout.g1", owner_pack="callout-pack", pack_installation_id="inst-bad",
            definitions=[{"kind": BindingKind.CALLOUT_PROFILE, "business_key": "records.callout", "version": 1,
                          "definition": {"method": "POST", "path_template": "/v1/records/x{record_key}"}}],
            actor=Actor.system("t"))
    assert not PackGeneration.objects.filter(generation_id="bad-callout.g1").exists()


@pytest.mark.django_db
def test_reading_a_stored_callout_with_an_invalid_template_is_refused(push_world):
    """A stored callout definition whose template is outside the grammar (written before the rule, with its
    receipts intact) is refused by the owner reader, so no epoch can be verified or dispatch read from it."""
    definition = BindingDefinition.objects.get(pack_generation__generation_id="p-callout-pack.g1",
                                               kind="callout_profile")
    with pytest.raises(OwnerFactInvalid):
        _reread_with_template(definition, "https://evil.example/{record_key}")


def _reread_with_template(definition: BindingDefinition, template: str):
    """Rewrite the stored definition (and its digests and receipt, so only the template is wrong) around the
    services, then read it through the owner reader."""
    from connector import receipts

    body = receipts.canonical_json({"method": "POST", "path_template": template, "timeout_ms": 5000})
    digest = receipts.definition_digest(kind=definition.kind, business_key=definition.business_key,
                                        definition_version=definition.definition_version, definition=body)
    receipt, receipt_digest = receipts.definition_receipt(
        pack_generation_id=definition.pack_generation.generation_id, kind=definition.kind,
        business_key=definition.business_key, definition_version=definition.definition_version,
        canonical_definition_digest=digest)
    force("UPDATE connector_bindingdefinition SET definition = %s, canonical_definition_digest = %s, receipt = %s, "
          "receipt_digest = %s WHERE id = %s", [body, digest, receipt, receipt_digest, definition.pk])
    return binding_definition_read(kind=definition.kind, pack_generation_id=definition.pack_generation.generation_id,
                                   pack_payload_digest=bytes(definition.pack_generation.payload_digest),
                                   business_key=definition.business_key,
                                   definition_version=definition.definition_version)


# -- authoring ----------------------------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("value", HOSTILE)
def test_authoring_refuses_an_unsafe_value_and_writes_nothing(push_world, value):
    """outbound_command_author raises OUTBOUND_PATH_UNSAFE (a closed code, not retryable) for every hostile
    value; no OutboundCommand or RemoteEffect exists afterwards. Proves: CV2-10-006, CV2-10-009"""
    with pytest.raises(OutboundPathUnsafe) as refused:
        author(push_world.accounts[0], record_id=value)
    assert (refused.value.code, refused.value.retryable) == ("OUTBOUND_PATH_UNSAFE", False)
    assert OutboundCommand.objects.count() == 0 and RemoteEffect.objects.count() == 0


# -- end to end: Runtime, egress, receiver -------------------------------------------------------------------------

HOSTILE_RECORD_IDS = ["inj/../../admin?x=1#f", "a%2Fb", "..", "x?y=1", "x#f", "%252e%252e", "\uff0fadmin"]


@pytest.mark.django_db
def test_a_hostile_record_id_is_rejected_by_runtime_and_never_reaches_the_receiver(push_world, receiver):
    """Events whose record ids would change the path are admitted, and Runtime records each item `rejected`
    with OUTBOUND_PATH_UNSAFE: the Execution completes (no retry loop, no quarantine), no CRM record and no
    OutboundCommand is kept (the mutation and its outbox intent share one savepoint). Safe ids in the same run
    are pushed; the receiver sees only paths of the template's shape, each decoding to the exact record id.
    Proves: CV2-10-001, CV2-10-006, CV2-10-036"""
    account = push_world.accounts[0]
    for n, record_id in enumerate(HOSTILE_RECORD_IDS):
        done = _run_event(account, record_id, n)
        assert done.state == "completed" and done.result_outcome == "rejected", record_id
        result = ApplicationResult.objects.get(command_id=done.command_id)
        assert result.detail == "rejected:OUTBOUND_PATH_UNSAFE", record_id
        assert not CrmRecord.objects.filter(account=account, record_key=record_id).exists()
    assert OutboundCommand.objects.count() == 0
    safe = ["plain-1", "50%", "caf\u00e9", "a;b=c"]
    for n, record_id in enumerate(safe, start=100):
        assert _run_event(account, record_id, n).result_outcome == "applied"
    _dispatch_all()
    paths = [r["path"] for r in receiver.requests]
    assert len(paths) == len(safe)
    for path in paths:
        assert path_fits_template(TEMPLATE, path) is None, path
        assert posixpath.normpath(unquote(path)).startswith("/v1/records/")
    assert sorted(unquote(p.rsplit("/", 1)[1]) for p in paths) == sorted(safe)
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}


@pytest.mark.django_db
@pytest.mark.parametrize("raw_path", ["/v1/admin?x=1", "/v1/records/inj/../../admin", "/v1/records/a%2Fb",
                                      "/v1/records/", "/v1/records/r1#f", "/v1/records/r1?x=1"])
def test_egress_never_sends_a_frozen_path_outside_its_template(push_world, receiver, raw_path):
    """A command row whose frozen path is outside its callout template (as older code wrote them with raw
    interpolation) is refused by the egress adapter after it wins `granted -> sending` and before any byte
    leaves: the receiver sees nothing, the attempt's evidence names OUTBOUND_PATH_UNSAFE, the permit is
    `returned` and the effect is terminal `no_effect` (no retry can do better). Proves: CV2-10-028,
    CV2-10-036, CV2-10-038, CV2-10-041"""
    command = author(push_world.accounts[0], record_id="r1")
    force("UPDATE effects_outboundcommand SET path = %s WHERE id = %s", [raw_path, command.pk])
    ready = acquire("h1")
    effect = send(ready)
    assert receiver.requests == []
    assert effect.state == "no_effect"
    attempt = RemoteEffectAttempt.objects.get(effect=effect)
    assert attempt.outcome == "no_effect" and attempt.evidence.startswith("OUTBOUND_PATH_UNSAFE, nothing sent")
    assert DispatchPermit.objects.get().state == "returned"


# -- provenance: OutboundCommand -> Execution -----------------------------------------------------------------------

@pytest.mark.django_db
def test_outbound_command_names_the_execution_that_authored_it_and_the_admin_links_both_ways(
        push_world, client):
    """Runtime passes the submitting Execution through the author hook: each OutboundCommand's
    `source_execution` is the Execution whose Runtime transaction authored it (not NULL), and the admin links
    Execution -> its OutboundCommands and OutboundCommand -> its Execution. Proves: CV2-10-001, CV2-10-010"""
    account = push_world.accounts[0]
    first, second = _run_event(account, "rec-a", 1), _run_event(account, "rec-b", 2)
    commands = {c.effect_root_id: c for c in OutboundCommand.objects.all()}
    assert commands[f"{first.command_id}:rec-a"].source_execution_id == first.pk
    assert commands[f"{second.command_id}:rec-b"].source_execution_id == second.pk

    client.force_login(User.objects.create_superuser("op", password="x"))
    command = commands[f"{first.command_id}:rec-a"]
    execution_page = client.get(reverse("admin:connector_execution_change", args=[first.pk])).content.decode()
    assert reverse("admin:effects_outboundcommand_change", args=[command.pk]) in execution_page
    command_page = client.get(reverse("admin:effects_outboundcommand_change", args=[command.pk])).content.decode()
    assert reverse("admin:connector_execution_change", args=[first.pk]) in command_page
    changelist = client.get(reverse("admin:effects_outboundcommand_changelist"),
                            {"source_execution__id__exact": first.pk})
    assert changelist.status_code == 200 and changelist.context["cl"].result_count == 1


@pytest.mark.django_db
def test_egress_retries_when_the_template_cannot_be_read_right_now(push_world, receiver, monkeypatch):
    """A template read that fails retryably (OWNER_UNAVAILABLE) after `granted -> sending` sends nothing and is
    not final: the attempt settles `no_effect` with that evidence and the effect returns to `prepared` for its
    next attempt on the frozen retry schedule (issue 37, D-421: not claimable before about 5 s), which sends the
    request. Proves: CV2-10-022, CV2-10-028"""
    from connector.errors import OwnerUnavailable
    from effects import egress

    author(push_world.accounts[0], record_id="r1")

    def unavailable(command):
        raise OwnerUnavailable("owner store unavailable")

    monkeypatch.setattr(egress, "frozen_path_template", unavailable)
    effect = send(acquire("h1"))
    assert receiver.requests == [] and effect.state == "prepared"
    assert RemoteEffectAttempt.objects.get(effect=effect).evidence.startswith("OWNER_UNAVAILABLE, nothing sent")
    monkeypatch.undo()
    assert 4 <= (effect.next_attempt_at - timezone.now()).total_seconds() <= 6
    assert claim("h1")[1] is None  # not before its scheduled time
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(seconds=7))
    assert send(acquire("h1")).state == "finalized"
    assert [r["path"] for r in receiver.requests] == ["/v1/records/r1"]
