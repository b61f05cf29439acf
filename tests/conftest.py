import pytest

from tests import fast_flush, fast_migrate

# Test-harness speedups (D-175): transactional tests end with a DELETE of every table instead of a TRUNCATE
# (tests/fast_flush.py); migrations do not pile up django-fsm receivers for historical models (tests/fast_migrate.py).
fast_flush.install()
fast_migrate.install()


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
