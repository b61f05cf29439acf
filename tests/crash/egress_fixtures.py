"""Fixtures of the outbound crash tests (tests/crash/test_outbound_crashes.py, test_outbound_batch_crashes.py):
the real loopback receiver, and tests/crash/conftest.py's child environment pointed at it. A module binds both
(`receiver = egress_fixtures.receiver`, `child_env = egress_fixtures.child_env`): its `child_env` then overrides
the conftest's."""
from __future__ import annotations

import pytest

from tests.effects.receiver import receiver  # noqa: F401 - the fixture tests/effects/conftest.py binds too
from tests.support import whole_seconds


@pytest.fixture
def child_env(child_env, receiver):
    """tests/crash/conftest.py's child environment, plus the receiver's URL and a short egress timeout; the
    DATABASE_URL already names the test database, so TEST_DB_SUFFIX is dropped."""
    env = {k: v for k, v in child_env.items() if k != "TEST_DB_SUFFIX"}
    env.update({"CONNECTOR_EGRESS_BASE_URL": receiver.url, "CONNECTOR_EGRESS_TIMEOUT_SECONDS": str(whole_seconds(1))})
    return env
