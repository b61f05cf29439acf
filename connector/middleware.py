"""Request middleware of the connector: the signed-in user is the actor of every identity change the request
makes (connector.identity records them in the audit trail)."""
from __future__ import annotations

from connector.actors import bind_request_user, unbind_request_user


class ActorMiddleware:
    """Place after AuthenticationMiddleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = bind_request_user(getattr(request, "user", None))
        try:
            return self.get_response(request)
        finally:
            unbind_request_user(token)
