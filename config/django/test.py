"""Test settings. The suite connects as the database administrator (DATABASE_ADMIN_URL's credentials when set,
else DATABASE_URL's) and runs under the product's roles with SET ROLE (config/pg_roles, tests/dbroles.py): the
owner migrates the test databases, every test body runs as the application role, and a child process started by
a test assumes the role named in DATABASE_ASSUME_ROLE."""
from urllib.parse import unquote, urlsplit

from config.django.base import *  # noqa: F401,F403
from config.django.base import DATABASE_URL_OPTIONS, DATABASES, session_options
from config.env import env_str
from connector import dbroles

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

# The one place durability is traded for speed, explicitly (issue 37 item 4, D-410): the suite's sessions, and the
# child processes a test starts with these settings, commit without waiting for the WAL flush unless
# CONNECTOR_DB_SYNCHRONOUS_COMMIT says otherwise. The product's settings (local, production) keep `on`.
DATABASE_SYNCHRONOUS_COMMIT = env_str("CONNECTOR_DB_SYNCHRONOUS_COMMIT", "off")
for _alias, _db in DATABASES.items():
    _db["OPTIONS"]["options"] = session_options(DATABASE_URL_OPTIONS[_alias], DATABASE_SYNCHRONOUS_COMMIT)
