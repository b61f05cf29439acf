from config.django.base import *  # noqa: F401,F403
from config.django.base import INSTALLED_APPS
from config.env import env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)

# The benchmarks (`manage.py bench ...`) are a development tool of the checkout, not part of the product package:
# only the development and test settings install them (D-512).
INSTALLED_APPS = [*INSTALLED_APPS, "bench"]
