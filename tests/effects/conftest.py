import pytest

from tests.effects.receiver import Receiver


@pytest.fixture
def receiver(settings):
    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": 1}
    yield r
    r.stop()


@pytest.fixture
def push_world(db):
    from connector.demo import build_world

    return build_world("p-", push=True)
