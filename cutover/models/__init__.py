from cutover.models.journal import *  # noqa: F401,F403
from cutover.models.succession import *  # noqa: F401,F403
from cutover.models.attempt import *  # noqa: F401,F403
from cutover.models.readiness import *  # noqa: F401,F403
from cutover.models.restore import *  # noqa: F401,F403
from cutover.models.removal import *  # noqa: F401,F403
