import pytest

from tests import fast_flush, fast_migrate
from tests.support import scaled

# Test-harness speedups (D-175): transactional tests end with a DELETE of every table instead of a TRUNCATE
# (tests/fast_flush.py); migrations do not pile up django-fsm receivers for historical models (tests/fast_migrate.py).
fast_flush.install()
fast_migrate.install()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """pytest-timeout's per-test limit (pyproject.toml `timeout`, or the test's own `timeout` marker) stretched by
    the suite's time factor when the test starts (tests/support.py): a slow machine fails no test for being slow."""
    marker = item.get_closest_marker("timeout")
    base = marker.args[0] if marker and marker.args else marker.kwargs.get("timeout") if marker else None
    if base is None:
        base = float(item.config.getini("timeout") or 0)
    if base:
        item.add_marker(pytest.mark.timeout(scaled(float(base))), append=False)
    yield


def pytest_sessionfinish(session, exitstatus):
    """The run's Redis keys go with it (tests/isolation.py); its test databases are dropped by pytest-django."""
    from django.conf import settings

    if settings.configured and hasattr(settings, "TEST_RUN"):
        from tests import isolation

        isolation.drop_redis_keys(abandoned_only=False)


DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback", "live_server"}


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """The roles exist on the server, the databases of this checkout's killed runs are gone (tests/isolation.py),
    and the test databases are migrated by the connector owner."""
    from tests import dbroles, isolation

    dbroles.prepare_server()
    isolation.drop_abandoned_databases()
    isolation.drop_redis_keys(abandoned_only=True)
    dbroles.use(dbroles.OWNER)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """Between tests the harness acts as the administrator it connects as (flushes, post-migrate grants)."""
    from tests import dbroles

    with django_db_blocker.unblock():
        dbroles.use(None)
    yield


@pytest.fixture
def administrator(_application_role):
    """The whole test acts as the administrator the suite connects as: benchmarks that create databases, run
    CHECKPOINT or setval, which no role of the running product may."""
    from tests import dbroles

    dbroles.use(None)
    yield


@pytest.fixture(autouse=True)
def _application_role(request):
    """Every test body that uses the database runs as the application role (docs/security.md)."""
    if request.node.get_closest_marker("django_db") is None and not DB_FIXTURES & set(request.fixturenames):
        yield
        return
    from tests import dbroles

    request.getfixturevalue("_django_db_helper")
    dbroles.use(dbroles.APP)
    yield
    dbroles.use(None)


@pytest.fixture(autouse=True)
def _open_broker_pools():
    """Each test publishes through open kombu pools. kombu keeps one process-wide pool per broker address; a test
    that closes a Celery app pointed at a private Redis (tests/faults, tests/crash) closes that address's pool for
    good, and private servers reuse freed ports, so a later publish could meet "Acquire on closed pool". A closed
    pool is forgotten before the test starts (tests.faults.servers.point_celery_at does the same on a switch)."""
    from kombu import pools

    if any(getattr(pool, "_closed", False) for pool in pools._all_pools()):
        from config.celery import app

        pools.reset()
        app._pool = None
        app.amqp._producer_pool = None
    yield


@pytest.fixture(autouse=True)
def _secret_dir(settings, tmp_path):
    """Each test gets its own secret backend directory (secrets never live in PostgreSQL)."""
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": str(tmp_path / "secrets")}


@pytest.fixture
def world(db):
    """The demo world built through the services: two accounts v2_serving on an active epoch, a second verified
    epoch, four binding kinds, credential generations with secrets in the backend."""
    from connector.demo import build_world

    return build_world("w-")


@pytest.fixture(scope="module")
def product_redis():
    """A private Redis for the processes of `product` (one per test module)."""
    from tests.faults.servers import RedisServer

    server = RedisServer()
    try:
        yield server.start()
    finally:
        server.cleanup()


@pytest.fixture
def product(settings, product_redis, tmp_path):
    """`make run`'s processes against this test's databases: web, the stage workers, beat and the demo CRM receiver
    (tests.faults.servers.product_processes)."""
    from tests.faults.servers import product_processes

    with product_processes(secret_dir=settings.CONNECTOR["SECRET_BACKEND_DIR"], redis_url=product_redis.url,
                           log_dir=tmp_path) as running:
        yield running
