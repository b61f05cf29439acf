import pytest

from connector.choices import EpochState, GateMode
from connector.demo import build_world


@pytest.mark.django_db(databases=["default", "journal"])
def test_demo_world_activates_through_services():
    """The demo world reaches an active epoch with every gate v2_serving on it, and a second verified epoch,
    only through services. Proves: CV2-02-028, CV2-02-030, CV2-02-041"""
    world = build_world("t-")
    assert world.active_epoch.state == EpochState.ACTIVE
    assert world.verified_epoch.state == EpochState.VERIFIED
    for account in world.accounts:
        account.serving_gate.refresh_from_db()
        assert account.serving_gate.mode == GateMode.V2_SERVING
        assert account.serving_gate.epoch_id == world.active_epoch.pk
        assert bytes(account.serving_gate.epoch_digest) == bytes(world.active_epoch.digest)
        assert account.serving_gate.fence == 6
