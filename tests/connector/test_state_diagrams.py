"""The committed state diagrams (docs/state-machines/) are generated from the code and match it. No database."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from connector.choices import CREDENTIAL_GATE_TRANSITIONS, EPOCH_TRANSITIONS, GATE_TRANSITIONS
from connector.management.commands.state_diagrams import discover
from cutover.choices import DECISION_TRANSITIONS, RESTORE_ATTEMPT_TRANSITIONS, SUCCESSION_DRAIN_TRANSITIONS

# The edge tables the PostgreSQL transition triggers enforce (connector/migrations/0002_db_rules.py,
# cutover/migrations/0002_decision_rules.py).
DB_TRIGGER_EDGES = {
    "connector.ServingEpoch.state": EPOCH_TRANSITIONS,
    "connector.AccountServingGate.mode": GATE_TRANSITIONS,
    "connector.CredentialGenerationDispatchGate.mode": CREDENTIAL_GATE_TRANSITIONS,
    "cutover.CutoverDecision.state": DECISION_TRANSITIONS,
    "cutover.RestoreAttempt.state": RESTORE_ATTEMPT_TRANSITIONS,
    "cutover.SuccessionDrain.state": SUCCESSION_DRAIN_TRANSITIONS,
}


def test_committed_state_diagrams_match_the_code():
    """docs/state-machines/ holds exactly what `state_diagrams` generates from the django-fsm transitions."""
    call_command("state_diagrams", "--check")


def test_every_state_machine_has_a_diagram():
    """Each of the four state machines built so far is discovered and drawn."""
    found = {f"{m.app_label}.{m.title}" for m in discover()}
    assert set(DB_TRIGGER_EDGES) <= found


@pytest.mark.parametrize("machine", sorted(DB_TRIGGER_EDGES))
def test_diagram_edges_equal_the_database_transition_table(machine):
    """The django-fsm edges drawn in the diagram are exactly the edges the database trigger allows
    (CV2-02-034: no unlisted transition)."""
    drawn = {m.app_label + "." + m.title: m for m in discover()}[machine]
    assert {(e.source, e.target) for e in drawn.edges if not e.on_error} == {
        (str(a), str(b)) for a, b in DB_TRIGGER_EDGES[machine]}


def test_check_reports_a_drifted_diagram(tmp_path):
    """`--check` exits non-zero when a file differs, is missing, or no longer has a state machine."""
    call_command("state_diagrams", "--output-dir", str(tmp_path))
    call_command("state_diagrams", "--check", "--output-dir", str(tmp_path))

    page = tmp_path / "ServingEpoch.md"
    page.write_text(page.read_text(encoding="utf-8").replace("draining --> retired", "draining --> active"),
                    encoding="utf-8")
    with pytest.raises(CommandError, match="differs from the code"):
        call_command("state_diagrams", "--check", "--output-dir", str(tmp_path))

    call_command("state_diagrams", "--output-dir", str(tmp_path))
    (tmp_path / "CutoverDecision.dot").unlink()
    (tmp_path / "Retired.md").write_text("old", encoding="utf-8")
    with pytest.raises(CommandError, match="missing") as excinfo:
        call_command("state_diagrams", "--check", "--output-dir", str(tmp_path))
    assert "stale" in str(excinfo.value)
