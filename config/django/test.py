from config.django.base import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = False
# STATIC_ROOT exists only where a test ran collectstatic (the real web process's own directory): look static files
# up per request instead of indexing a missing directory at startup.
WHITENOISE_AUTOREFRESH = True
