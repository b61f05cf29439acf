import pytest

from tests.effects.delivery.receiver import DeliveryReceiver


@pytest.fixture
def sync_receiver():
    r = DeliveryReceiver(kind="sync_batch").start()
    yield r
    r.stop()


@pytest.fixture
def async_receiver():
    r = DeliveryReceiver(kind="async_bulk_job").start()
    yield r
    r.stop()


def pytest_collection_modifyitems(config, items):
    """Every delivery test may touch the journal database (journal epoch attestations live there); a test that
    sets its own django_db mark (transactional ones) keeps it."""
    for item in items:
        if "tests/effects/delivery/" in str(item.fspath) and item.get_closest_marker("django_db") is None:
            item.add_marker(pytest.mark.django_db(databases=["default", "journal"]))


@pytest.fixture
def world(sync_receiver):
    from tests.effects.delivery.world import build

    return build(sync_receiver.url)
