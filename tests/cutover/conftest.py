import pytest
from django.db import connections

from cutover.ports import v1_owner
from tests.crash.conftest import child_env, run_child  # noqa: F401,E402 (fixtures re-exported)
from tests.support import whole_seconds


@pytest.fixture
def cutover_env(settings, tmp_path):
    """The V1 owner port read afresh, restore points under the test's own folder, and the loopback receiver as
    the egress base URL (1 s timeout); every connection closed afterwards (the tests' threads and children)."""
    from tests.effects.receiver import Receiver

    v1_owner.cache_clear()
    settings.CUTOVER_RESTORE_POINT_DIR = str(tmp_path / "restore-points")
    receiver = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR,
                          "EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    yield receiver
    receiver.stop()
    connections.close_all()
