from effects.models.holders import *  # noqa: F401,F403
from effects.models.outbound import *  # noqa: F401,F403
from effects.models.delivery import *  # noqa: F401,F403
from effects.models.limits import *  # noqa: F401,F403
from effects.models.tracing import *  # noqa: F401,F403
from effects.models.intents import *  # noqa: F401,F403
