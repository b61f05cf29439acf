"""Test settings. The suite connects as the database administrator (DATABASE_ADMIN_URL's credentials when set,
else DATABASE_URL's) and runs under the product's roles with SET ROLE (config/pg_roles, tests/dbroles.py): the
owner migrates the test databases, every test body runs as the application role, and a child process started by
a test assumes the role named in DATABASE_ASSUME_ROLE.

Several test runs share one PostgreSQL server and one Redis (two checkouts, or one checkout twice, on the machine's
shared servers: issue 37 item 9, D-451). Each run has its own id, CONNECTOR_TEST_RUN (a digest of the checkout's
path and the pytest process's pid unless set; exported, so the web, workers and children a test starts share it):
it ends the name of each test database and begins every key the run writes to Redis. Two runs see nothing of
each other's."""
import hashlib
import os
import re
import tempfile
from urllib.parse import unquote, urlsplit

from config.django.base import *  # noqa: F401,F403
from config.django.base import BASE_DIR, DATABASE_URL_OPTIONS, DATABASES, INSTALLED_APPS, session_options
from config.env import env_str
from connector import dbroles

RUN_ID_RE = re.compile(r"^[a-z0-9_]{1,24}$")


def _run_id() -> str:
    """This run's id: CONNECTOR_TEST_RUN if set, else `<checkout digest>_<pid>`, then exported for the children."""
    run = os.environ.get("CONNECTOR_TEST_RUN", "").strip()
    if not run:
        run = f"{hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:6]}_{os.getpid()}"
        os.environ["CONNECTOR_TEST_RUN"] = run
    if not RUN_ID_RE.match(run):
        raise ValueError(f"CONNECTOR_TEST_RUN={run!r} must match {RUN_ID_RE.pattern}")
    return run


TEST_RUN = _run_id()
# The suite runs the benches small (tests/connector/test_bench_*.py): the bench app is installed here and in local
# settings, never in production (D-512).
INSTALLED_APPS = [*INSTALLED_APPS, "bench"]
CONNECTOR_REDIS_KEY_PREFIX = f"connector-test-{TEST_RUN}:"
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": CONNECTOR_REDIS_KEY_PREFIX}
# Each worker a test starts writes its heartbeat file here unless the test names its own.
CONNECTOR_WORKER_HEARTBEAT_FILE = env_str("CONNECTOR_WORKER_HEARTBEAT_FILE",
                                          os.path.join(tempfile.gettempdir(), f"connector-test-{TEST_RUN}.heartbeat"))

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False
# STATIC_ROOT exists only where a test ran collectstatic (the real web process's own directory): look static files
# up per request instead of indexing a missing directory at startup.
WHITENOISE_AUTOREFRESH = True

_ADMIN = urlsplit(env_str("DATABASE_ADMIN_URL", ""))
for _db in DATABASES.values():
    _db["ENGINE"] = "config.pg_roles"
    if _ADMIN.username:
        _db["USER"] = unquote(_ADMIN.username)
        _db["PASSWORD"] = unquote(_ADMIN.password or "")
    _db["OPTIONS"]["assume_role"] = env_str("DATABASE_ASSUME_ROLE", "") or None
    _db["TEST"]["OWNER"] = dbroles.OWNER
    if not _db["NAME"].endswith(f"_{TEST_RUN}"):  # a child a test started is pointed at the run's database already
        _db["TEST"]["NAME"] = f"{_db['TEST']['NAME']}_{TEST_RUN}"
        assert len(_db["TEST"]["NAME"]) <= 63, f"test database name {_db['TEST']['NAME']!r} is longer than 63 bytes"

# The one place durability is traded for speed, explicitly (issue 37 item 4, D-410): the suite's sessions, and the
# child processes a test starts with these settings, commit without waiting for the WAL flush unless
# CONNECTOR_DB_SYNCHRONOUS_COMMIT says otherwise. The product's settings (local, production) keep `on`.
DATABASE_SYNCHRONOUS_COMMIT = env_str("CONNECTOR_DB_SYNCHRONOUS_COMMIT", "off")
for _alias, _db in DATABASES.items():
    _db["OPTIONS"]["options"] = session_options(DATABASE_URL_OPTIONS[_alias], DATABASE_SYNCHRONOUS_COMMIT)
