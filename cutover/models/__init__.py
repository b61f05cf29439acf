from cutover.models.journal import *  # noqa: F401,F403
