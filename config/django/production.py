"""Production settings: base plus the deployment checklist of docs/security.md. `manage.py check --deploy` passes
with no warning (a test runs it). Every value comes from the environment (STYLE R18)."""
from django.core.exceptions import ImproperlyConfigured

from config.django.base import *  # noqa: F401,F403
from config.env import env_bool, env_int, env_list, env_str

DEBUG = False

# SECRET_KEY is required: the base's development key is public, so production refuses to start without its own.
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5 or SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY must be set for config.django.production: at least 50 characters with at least 5 "
        "distinct ones, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(64))'` (docs/security.md)")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS must name the host(s) this deployment serves")
# /metrics reads every stage's backlog and quarantine: production serves it only with a bearer token.
CONNECTOR_METRICS_TOKEN = env_str("CONNECTOR_METRICS_TOKEN", "")
if len(CONNECTOR_METRICS_TOKEN) < 32:
    raise ImproperlyConfigured(
        "CONNECTOR_METRICS_TOKEN must be set for config.django.production: at least 32 characters, given to the "
        "Prometheus scrape job as its bearer token (docs/operations.md)")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [f"https://{h}" for h in ALLOWED_HOSTS
                                                                  if not h.startswith(".")])

# Durable commits (issue 37 item 4, D-410): never `off` in production, and /readyz fails while a database does not
# commit durably (the server's fsync or full_page_writes off).
if DATABASE_SYNCHRONOUS_COMMIT == "off":  # noqa: F405 - from base
    raise ImproperlyConfigured("CONNECTOR_DB_SYNCHRONOUS_COMMIT=off is refused by config.django.production: an "
                               "answered request must survive a crash of PostgreSQL (docs/operations.md)")
CONNECTOR_REQUIRE_DURABLE_COMMITS = True

# TLS ends at the reverse proxy: it sets X-Forwarded-Proto, and only the proxy may reach the web process.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
SECURE_REDIRECT_EXEMPT = [r"^healthz?/?$", r"^readyz/?$"]  # probes of the orchestrator, over plain HTTP
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True

# The client address axes counts failures by: the proxy's X-Forwarded-For, trusting this many proxies.
AXES_IPWARE_PROXY_COUNT = env_int("DJANGO_PROXY_COUNT", 1)
AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
