"""Base settings. Production differs only through environment variables (DJANGO_ prefix for Django's own)."""
from __future__ import annotations

from datetime import timedelta

import dj_database_url
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from config.env import BASE_DIR, env_bool, env_int, env_list, env_str, journal_url_for
from config.settings.celery import *  # noqa: F401,F403
from config.settings.connector import *  # noqa: F401,F403
from config.settings.drf import *  # noqa: F401,F403
from config.settings.logging import *  # noqa: F401,F403

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "insecure-development-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "csp",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Redoc/Swagger UI served from this package's static files, never a CDN
    "django_fsm",
    "connector",
    "effects",
    "cutover",
    "governance",
    "v1",
    "observability",  # health, /metrics and the overview's stage samples (issue 21); no product app imports it
]

MIDDLEWARE = [
    "observability.admission.AdmissionMetricsMiddleware",  # admission latency by outcome (issue 21, /metrics)
    "django.middleware.security.SecurityMiddleware",
    # Static files (admin, governance screens, API docs) from STATIC_ROOT under any WSGI server (D-163).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "connector.middleware.ActorMiddleware",  # the signed-in user is the actor of identity audit records
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out sign-in into a 429 (connector.api.lockout)
]

ROOT_URLCONF = "config.urls"

# The signed machine-to-machine admission POST (config/wsgi.py's dispatch, D-540) runs only these: the admission
# metrics, and the security headers every answer carries (HSTS, the SSL redirect, nosniff, referrer policy,
# X-Frame-Options, CSP). No session, CSRF, authentication, actor, messages or sign-in throttling: the HMAC
# signature is its only authentication. Its URLconf is config.urls_admission.
ADMISSION_MIDDLEWARE = [
    "observability.admission.AdmissionMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]
ADMISSION_URLCONF = "config.urls_admission"
WSGI_APPLICATION = "config.wsgi.application"

# /metrics (issue 21, docs/operations.md): open when empty (development, tests), else only with
# `Authorization: Bearer <token>`. Production requires it.
CONNECTOR_METRICS_TOKEN = env_str("CONNECTOR_METRICS_TOKEN", "")
# Collectors /metrics adds to the engine's own (observability.metrics): apps above observability contribute figures
# without being imported by it.
OBSERVABILITY_COLLECTORS = ["governance.metrics.ReasonDeadlineCollector"]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_DEFAULT_DB_URL = "postgres://postgres@127.0.0.1:5432/connector"
DATABASE_URL = env_str("DATABASE_URL", _DEFAULT_DB_URL)
# The journal (CutoverDecision, RestoreAttempt) lives in its own database on the same server unless told
# otherwise: it must survive a restore of `default`.
JOURNAL_DATABASE_URL = env_str("JOURNAL_DATABASE_URL", journal_url_for(DATABASE_URL))

# The database owner (migrations, the coordinator's restore point dump/restore): docs/security.md "Database roles".
DATABASE_OWNER_URL = env_str("DATABASE_OWNER_URL", "")

# Persistent connections (issue 18, D-198): a request or Celery task reuses its process's connection for up to
# DATABASE_CONN_MAX_AGE seconds instead of opening a new one (6-9 ms each). Health checks make the first use after
# a request or task boundary test the kept connection (`SELECT 1`) and reconnect if PostgreSQL restarted or
# terminated the session; a connection that raised a database error is closed at the next boundary.
DATABASE_CONN_MAX_AGE = env_int("DJANGO_CONN_MAX_AGE", 600)
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=DATABASE_CONN_MAX_AGE, conn_health_checks=True),
    "journal": dj_database_url.parse(JOURNAL_DATABASE_URL, conn_max_age=DATABASE_CONN_MAX_AGE,
                                     conn_health_checks=True),
}
# Durable commits (issue 37 item 4, D-410): every session of the product commits with this synchronous_commit,
# whatever the server's default, so a 201 (or any answer after a COMMIT) survives a crash of PostgreSQL or its host.
# Only the test suite trades it for speed (config/django/test.py); production refuses `off`. /readyz reports the
# server's fsync and full_page_writes beside it (observability/health.py).
DATABASE_SYNCHRONOUS_COMMIT = env_str("CONNECTOR_DB_SYNCHRONOUS_COMMIT", "on")
SYNCHRONOUS_COMMIT_LEVELS = ("on", "remote_apply", "remote_write", "local", "off")
if DATABASE_SYNCHRONOUS_COMMIT not in SYNCHRONOUS_COMMIT_LEVELS:
    raise ImproperlyConfigured(f"CONNECTOR_DB_SYNCHRONOUS_COMMIT={DATABASE_SYNCHRONOUS_COMMIT!r}: expected one of "
                               f"{', '.join(SYNCHRONOUS_COMMIT_LEVELS)}")
# /readyz fails (503) when a database does not commit durably: fsync or full_page_writes off on the server, or the
# session's synchronous_commit off. Production requires it; elsewhere the check only reports.
CONNECTOR_REQUIRE_DURABLE_COMMITS = env_bool("CONNECTOR_REQUIRE_DURABLE_COMMITS", False)


def session_options(options: str, synchronous_commit: str) -> str:
    """libpq `options` setting synchronous_commit for the session, after any the URL already carries."""
    return " ".join(filter(None, [options, f"-c synchronous_commit={synchronous_commit}"]))


# the libpq `options` each URL carried (?options=...), kept so that test settings can set another level
DATABASE_URL_OPTIONS = {alias: _db.get("OPTIONS", {}).get("options", "") for alias, _db in DATABASES.items()}
for _alias, _db in DATABASES.items():
    _db.setdefault("OPTIONS", {})
    _db["OPTIONS"]["options"] = session_options(DATABASE_URL_OPTIONS[_alias], DATABASE_SYNCHRONOUS_COMMIT)
    # TEST_DB_SUFFIX lets several suites run side by side on one server (e.g. a fallback proof, a helper).
    _db["TEST"] = {"NAME": "test_" + _db["NAME"] + env_str("TEST_DB_SUFFIX", "")}
DATABASE_ROUTERS = ["config.routers.JournalRouter"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env_str("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles"))  # filled by `manage.py collectstatic`

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "governance:overview"
LOGOUT_REDIRECT_URL = "login"
SESSION_COOKIE_AGE = 8 * 3600  # a working day; sessions also end when the browser closes
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
CSRF_COOKIE_HTTPONLY = True

# -- Security (issue 17, docs/security.md) ------------------------------------------------------------------------
# Credential guessing: django-axes counts failed sign-ins (login form, admin login, HTTP Basic on the API) per
# (username, client address); after the limit that pair is refused for the cool-off, the right password included,
# with a 429 and Retry-After.
AUTHENTICATION_BACKENDS = ["connector.api.lockout.RequestAxesBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("CONNECTOR_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("CONNECTOR_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_DISABLE_ACCESS_LOG = True  # sign-ins are not an audit of their own here; failures are counted
AXES_LOCKOUT_CALLABLE = "connector.api.lockout.lockout_response"
AXES_VERBOSE = False

# Content-Security-Policy on every response: only this origin's scripts (and the screens' nonced inline one), styles (the screens' own inline <style>
# blocks), images and forms; no framing, no plugins.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],  # the screens' one small inline script (copy a digest) carries the nonce
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
