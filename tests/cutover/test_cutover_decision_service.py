import pytest
from connector.errors import FenceStale, TransitionRefused
from cutover.services import decision as d
from tests.concurrency import run_concurrently

pytestmark = pytest.mark.django_db(databases=["default", "journal"], transaction=True)


def test_decision_cas_and_fence():
    """The decision moves only along its table with the observed fence; a stale fence or wrong branch writes
    nothing. Proves: CV2-12-058, CV2-12-059, CV2-12-060, CV2-12-061, CV2-12-062"""
    first = d.decision_open("att-1")
    assert d.decision_open("att-1").pk == first.pk
    with pytest.raises(FenceStale):
        d.decision_choose_activation("att-1", expected_fence=first.fence + 1)
    won = d.decision_choose_activation("att-1", expected_fence=first.fence)
    with pytest.raises(TransitionRefused):
        d.decision_choose_restore("att-1")
    assert d.decision_commit_activation("att-1", expected_fence=won.fence).state == "v2_committed"
    d.decision_open("att-2")
    assert d.decision_choose_restore("att-2").state == "restoring_v1"
    assert d.decision_complete_restore("att-2").state == "v1_restored"
    with pytest.raises(TransitionRefused):
        d.decision_choose_activation("att-2")


def test_activation_and_restore_race_pick_one_branch():
    """Threads on separate connections race for rollback_open: exactly one branch wins. Proves: CV2-12-085"""
    opened = d.decision_open("att-race")
    activate, restore = run_concurrently(
        [lambda: d.decision_choose_activation("att-race", expected_fence=opened.fence).state,
         lambda: d.decision_choose_restore("att-race", expected_fence=opened.fence).state],
        expect=(FenceStale, TransitionRefused))
    outcomes = {name: r.code if isinstance(r, BaseException) else r
                for name, r in (("activate", activate), ("restore", restore))}
    assert sorted(outcomes.values()).count("FENCE_STALE") + sorted(outcomes.values()).count("TRANSITION_REFUSED") == 1
    assert d.decision_read("att-race").state in ("activating_v2", "restoring_v1")
