"""Words a person reads (issue 38 item 4, D-483..D-485): every state and mode code the operator screens show has a
label and a one-line explanation from one source, docs/glossary.md's "States and modes in words" section, rendered
by one template tag beside the code; digests are shortened with the full value on hover and a copy button; the
overview's charts have axes with units, one colour per series and a caption; the demo's first login has a role."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core.management import call_command
from django.template import Context, Template

from connector.selectors import browse
from connector.selectors.replay import DISPOSITIONS
from effects.delivery.contract import contract
from effects.services.dispatch import RECONCILE_DECISIONS
from governance import words
from observability.readings import STAGES
from tests.governance.test_screens import client_for, uncertain  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
# machine -> the model field whose choices the screens show under it
SHOWN_FIELDS = {
    "effect": ("effects.RemoteEffect", "state"), "attempt": ("effects.RemoteEffectAttempt", "outcome"),
    "permit": ("effects.DispatchPermit", "state"), "link": ("effects.RemoteLink", "state"),
    "link_decision": ("effects.RemoteLinkResolution", "decision"),
    "intent": ("effects.RemoteCallIntent", "disposition"), "holder": ("effects.ProcessGeneration", "state"),
    "execution": ("connector.Execution", "state"), "dependency": ("connector.ExecutionDependency", "state"),
    "result": ("connector.ApplicationResult", "outcome"), "lane": ("connector.OrderingLane", "state"),
    "resumption": ("connector.LaneResumption", "mode"), "window": ("connector.ProjectionWindow", "state"),
    "receipt_kind": ("connector.Receipt", "kind"), "component": ("connector.ReceiptComponent", "disposition"),
    "gate": ("connector.AccountServingGate", "mode"),
    "credential_gate": ("connector.CredentialGenerationDispatchGate", "mode"),
    "epoch": ("connector.ServingEpoch", "state"), "decision": ("cutover.CutoverDecision", "state"),
    "barrier_set": ("cutover.ServingPublicationBarrierSet", "state"), "drain": ("cutover.SuccessionDrain", "state"),
    "cutover": ("cutover.ServiceCutoverAttempt", "outcome"), "v1_outcome": ("cutover.V1Reconciliation", "outcome"),
    "restore": ("cutover.RestoreAttempt", "state"), "v1_effect": ("v1.V1OutboundEffect", "state"),
    "approval": ("connector.DualApprovalRequest", "state"),
    "certification": ("effects.ReceiverCertification", "state"),
    "assurance": ("effects.ReceiverCertification", "assurance_mode"),
    "delivery_gate": ("effects.MutationGate", "state"),
    "delivery_parent": ("effects.DeliveryParent", "state"), "delivery": ("effects.DeliveryOperation", "state"),
    "replay_mode": ("connector.ReplayRequest", "mode"),
}
# State-like columns no governance screen shows (the V1 release's own bookkeeping, browsed in the admin only).
NOT_SHOWN = {("v1.V1ProcessGeneration", "state"), ("v1.V1WorkItem", "state")}
STATE_LIKE = ("state", "mode", "outcome", "disposition", "decision", "assurance_mode", "lane_status")


def test_every_state_like_column_is_either_shown_in_words_or_named_as_not_shown():
    """A new model with a state, mode, outcome, disposition or decision column with choices fails here until its
    machine has glossary words (SHOWN_FIELDS) or it is named as never shown. Proves: issue 38 item 4"""
    shown = set(SHOWN_FIELDS.values())
    columns = {(model._meta.label, field.name) for model in apps.get_models()
               if model._meta.app_label in ("connector", "effects", "cutover", "v1")
               for field in model._meta.fields if field.name in STATE_LIKE and field.choices}
    assert columns - shown - NOT_SHOWN == set()


def shown_codes() -> dict[str, set[str]]:
    """Every (machine, code) a screen can show: the model choices above and the closed vocabularies the views
    render (receipt list states, reconcile decisions, board item kinds, overview stages and series, phases)."""
    codes = {machine: {str(value) for value, _ in apps.get_model(label)._meta.get_field(field).choices}
             for machine, (label, field) in SHOWN_FIELDS.items()}
    codes["attempt"].add("")  # an open attempt
    codes["receipt"] = {*browse.RECEIPT_STATES, "gate_closed"}
    codes["reconcile"] = set(RECONCILE_DECISIONS)
    codes["stage"] = {stage.name for stage in STAGES}
    codes["throughput"] = {"admitted", "materialized", "completed", "effects finalized"}
    codes["phase"] = {"done", "current", "blocked", "pending"}
    codes["projection"] = {"", "pending", "minted", "superseded"}
    codes["gap"] = {"quarantine_partition", "skip_with_evidence", "operator_skip_with_evidence"}
    codes["v1_effect"].add("io_may_have_started")
    codes["replay_event"] = set(DISPOSITIONS)
    codes["delivery_attempt"] = {"", "not_started", "answered", "ambiguous"}
    for axis, values in contract().axes.items():
        codes[f"axis_{axis}"] = set(values)
    return codes


def missing(found: dict[str, dict[str, words.Word]]) -> list[str]:
    return sorted(f"{machine}:{code}" for machine, codes in shown_codes().items() for code in codes
                  if code not in found.get(machine, {}))


def test_every_state_and_mode_a_screen_shows_has_a_label_and_an_explanation():
    """Each value of the shown models' state and mode choices (and each closed vocabulary the views render) has a
    glossary row with a label and an explanation; the delivery states come from the contract's tuples. Removing
    one row from the glossary text makes this check fail. Proves: issue 38 item 4"""
    found = words.words()
    assert missing(found) == []
    assert set(found["delivery"]) == set(contract().tuples)
    # the board and the queue name an item's machine by its kind (governance.items.Item.kind, governance.poison)
    assert {"effect", "delivery", "execution", "lane", "component", "gate", "credential_gate", "delivery_gate",
            "v1_effect", "receipt", "window", "epoch"} <= set(found)
    assert all(w.label and w.explanation for table in found.values() for w in table.values())
    text = words.GLOSSARY.read_text()
    without = text.replace("| `no_effect` | Ended without effect |", "| `no_effec` | Ended without effect |")
    assert missing({**words.parse(without), "delivery": found["delivery"]}) == ["effect:no_effect"]


@pytest.mark.parametrize("broken, why", [
    ("# Glossary\n", "no"), ("## States and modes in words\n\n| `a` | b | c |\n", "not a `code`"),
    ("## States and modes in words\n\n### m: x\n\n| `a` | b | c |\n| `a` | d | e |\n", "twice"),
    ("## States and modes in words\n\n### m: x\n\n| `a` | b |\n", "not a `code`"),
])
def test_a_malformed_glossary_section_is_refused(broken, why):
    """The parser refuses a missing section, a row outside a table, a duplicate code, a row without three cells
    (GovernanceConfig.ready parses it at startup, so the process fails, not a page). Proves: issue 38 item 4"""
    with pytest.raises(words.GlossaryInvalid, match=why):
        words.parse(broken)


def test_no_template_renders_a_raw_state_code():
    """Every state or mode code on the screens goes through `{% state %}`: no template prints one in a bare badge,
    and no template shortens a digest by hand (`{% digest %}` does). Proves: issue 38 item 4"""
    raw = []
    for path in sorted((ROOT / "templates" / "governance").glob("*.html")):
        text = path.read_text()
        raw += [f"{path.name}: {m}" for m in re.findall(r'class="badge"[^>]*>\{\{[^}]*\}\}', text)]
        raw += [f"{path.name}: {m}" for m in re.findall(r'\{\{[^}]*hex\|slice[^}]*\}\}', text)]
    assert raw == []


def test_the_state_tag_renders_code_label_and_explanation_and_the_digest_tag_a_short_copyable_form():
    """`{% state %}` shows the code, its label and (long) its explanation, escaped; an unknown code says it is
    not in the glossary; `{% digest %}` shows 12 characters, the full value in the title and a copy button."""
    page = Template('{% load words %}{% state "no_effect" "effect" long=True %}|{% state "zzz" "effect" %}|'
                    '{% state "no_effect" "reconcile" text=True %}|{% digest d %}|{% digest none %}').render(
        Context({"d": bytes(range(32)), "none": None}))
    full = bytes(range(32)).hex()
    assert '<span class="badge">no_effect</span> Ended without effect <span class="explain">Proven not applied' in page
    assert "(not in the glossary)" in page and "It did not happen (no_effect)" in page
    assert f'<code class="mono" title="{full}">{full[:12]}…</code>' in page
    assert f'data-copy="{full}"' in page and ">Copy</button>" in page and page.endswith("|—")


def test_the_effect_page_shows_words_and_short_digests_with_a_nonced_copy_script(people, uncertain):  # noqa: F811
    """The effect page: the state's label and explanation next to its code, each attempt's outcome in words, the
    reconcile options in words; the response digest shortened with a copy button; the copy script carries the
    CSP nonce the response's Content-Security-Policy names. Proves: issue 38 item 4"""
    response = client_for(people["auditor"]).get(f"/queue/effect/{uncertain.pk}/")
    page = response.content.decode()
    assert '<span class="badge">uncertain</span> Outcome unknown <span class="explain">' in page
    assert "Unknown</span>" in page  # the attempt's outcome
    nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"]).group(1)
    assert f'<script nonce="{nonce}">' in page and "navigator.clipboard" in page


def test_the_overview_charts_have_axes_units_captions_and_one_colour_per_series(people):
    """Every chart has both axes with their units and a caption saying what it shows; every series on the page has
    its own colour (a series drawn twice keeps its colour, no two series share one); stage names are labelled and
    explained; the per-minute figures are a captioned table. Proves: issue 38 item 4"""
    from governance.views import PALETTE, THROUGHPUT, series_colours

    page = client_for(people["auditor"]).get("/").content.decode()
    assert page.count("minutes before now") == 4 and page.count("What it shows:") == 4
    for unit in ("per minute", "items", "seconds"):
        assert f'text-anchor="middle">{unit}</text>' in page
    colours = series_colours([*THROUGHPUT, *(s.name for s in STAGES)])
    assert len(set(colours.values())) == len(colours) and len(PALETTE) == len(set(PALETTE))
    swatches = re.findall(r'<span class="swatch" style="background:(#[0-9a-f]{6})"></span>([^<]*<[^>]*>[^<]*)', page)
    by_colour: dict[str, set[str]] = {}
    for colour, label in swatches:
        by_colour.setdefault(colour, set()).add(re.sub(r"<[^>]*>", "", label).strip())
    assert by_colour and all(len(labels) == 1 for labels in by_colour.values()), by_colour
    assert "Receipts to materialize" in page and "<code>materialization_due</code>" in page
    assert 'id="per-minute"' in page and "Per minute:" not in page


@pytest.mark.django_db(databases=["default", "journal"])
def test_the_demo_operator_login_shows_its_role_not_no_role():
    """`make run` prints the `operator` login first: demo_load makes it a superuser (the admin's login) in no
    group, and the header read only groups, so it said "(no role)". The header names a superuser's standing.
    Proves: issue 38 item 4"""
    call_command("demo_load", password="pw-demo", stdout=open("/dev/null", "w"))
    page = client_for(User.objects.get(username="operator")).get("/").content.decode()
    assert "(no role)" not in page and "operator (superuser: every permission)" in page
    page = client_for(User.objects.get(username="oscar")).get("/").content.decode()
    assert "oscar (operator)" in page
