import pytest

from tests.effects.receiver import receiver  # noqa: F401 - the fixture, shared with tests/crash/egress_fixtures.py


@pytest.fixture
def push_world(db):
    from connector.demo import build_world

    return build_world("p-", push=True)
