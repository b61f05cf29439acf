from connector.models.approvals import *  # noqa: F401,F403
from connector.models.audit import *  # noqa: F401,F403
from connector.models.execution import *  # noqa: F401,F403
from connector.models.ingress import *  # noqa: F401,F403
from connector.models.ordering import *  # noqa: F401,F403
from connector.models.owners import *  # noqa: F401,F403
from connector.models.runtime import *  # noqa: F401,F403
from connector.models.serving import *  # noqa: F401,F403
