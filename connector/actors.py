"""Who performs a write: a principal name, and the Django user when a person acts (permissions apply)."""
from __future__ import annotations

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
