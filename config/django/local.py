from config.django.base import *  # noqa: F401,F403
from config.env import env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)
