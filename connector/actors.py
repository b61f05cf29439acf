"""Who performs a write: a principal name, and the Django user when a person acts (permissions apply)."""
from __future__ import annotations

import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Actor:
    principal: str
    user: Any = None

    @classmethod
    def system(cls, name: str) -> "Actor":
        return cls(principal=f"system:{name}")

    @classmethod
    def for_user(cls, user: Any) -> "Actor":
        return cls(principal=f"user:{user.get_username()}", user=user)

    def __str__(self) -> str:
        return self.principal


# -- who is acting right now (identity audit) -------------------------------------------------------------------
# Identity changes (a user created, a role granted, a user activated) are recorded by signal receivers that see the
# model, not the request: the request middleware (connector.middleware.ActorMiddleware) names the signed-in user
# here for the duration of each request, and a process outside any request (a management command, a shell) is a
# system actor named after its command.
_REQUEST_USER: ContextVar[Any] = ContextVar("connector_request_user", default=None)


def bind_request_user(user: Any):
    """Name the request's user (a lazy object is fine) as the current actor; returns the token to reset."""
    return _REQUEST_USER.set(user)


def unbind_request_user(token) -> None:
    _REQUEST_USER.reset(token)


def current_actor() -> Actor:
    user = _REQUEST_USER.get()
    if user is not None and getattr(user, "is_authenticated", False):
        return Actor.for_user(user)
    argv = [arg for arg in sys.argv[:2] if arg]
    command = argv[1] if len(argv) > 1 and argv[0].endswith("manage.py") else "process"
    return Actor.system(command)
