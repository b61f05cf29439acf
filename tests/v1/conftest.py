import pytest

from tests.crash.conftest import child_env, run_child  # noqa: F401 (fixtures re-exported)
from tests.effects.receiver import Receiver
from tests.support import whole_seconds


@pytest.fixture
def provider(settings):
    """The provider V1's egress calls: a real loopback HTTP receiver counting applications per idempotency key."""
    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    yield r
    r.stop()


@pytest.fixture
def generation(db):
    from v1 import runtime

    return runtime.generation_start(started_by="test")
