from effects.services.delivery import runner


def test_plan_and_deliver_full(world, sync_receiver):
    parent = world.plan()
    assert parent.state == "ADMITTED"
    states = runner.drive_parent(parent.pk)
    assert states == ["final_full_promoted", "final_full_promoted"], states
    assert sorted(sync_receiver.applied.values()) == [1, 1]
