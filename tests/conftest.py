import pytest


@pytest.fixture(autouse=True)
def _secret_dir(settings, tmp_path):
    """Each test gets its own secret backend directory (secrets never live in PostgreSQL)."""
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": str(tmp_path / "secrets")}
