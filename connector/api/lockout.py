"""Throttling of credential guessing (issue 17, docs/security.md): django-axes counts failed sign-ins per
(username, client address) for the login form, the admin's login and HTTP Basic on the API; after
AXES_FAILURE_LIMIT failures that pair is locked out for AXES_COOLOFF_TIME, the right password included.

A locked-out request is answered 429 with `Retry-After` (the cool-off in seconds): the login pages with a page
saying so, the API with its catalog body `{"code": "TOO_MANY_ATTEMPTS", "detail": ...}`."""
from __future__ import annotations

import math
from datetime import timedelta

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off
from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BasicAuthentication

API_PREFIX = "/api/"


def retry_after(request) -> int:
    cool_off = get_cool_off(request)
    return max(1, math.ceil(cool_off.total_seconds())) if cool_off else 3600


def lockout_response(request, original_response=None, credentials=None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the 429 every locked-out sign-in gets."""
    seconds = retry_after(request)
    retry_at = (timezone.now() + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M UTC")
    detail = (f"Too many failed sign-ins for this user from this address: try again after {retry_at} (in "
              f"{seconds} seconds; the right password is refused until then), or ask an administrator to unlock "
              "the sign-in now.")
    if request.path.startswith(API_PREFIX):
        response = JsonResponse({"code": "TOO_MANY_ATTEMPTS", "detail": detail}, status=429)
    else:
        username = (credentials or {}).get("username") or request.POST.get("username", "")
        context = {"detail": detail, "seconds": seconds, "retry_at": retry_at, "username": username}
        response = HttpResponse(render_to_string("registration/locked.html", context, request=request), status=429)
    response["Retry-After"] = str(seconds)
    return response


class LockoutAwareBasicAuthentication(BasicAuthentication):
    """HTTP Basic whose refusal of a locked-out pair is a 429 with Retry-After (DRF's Throttled) rather than the
    401 a wrong password gets: the client learns to wait instead of retrying."""

    def authenticate_credentials(self, userid, password, request=None):
        if "\x00" in userid or "\x00" in password:  # PostgreSQL text cannot hold NUL: refuse, never a 500
            raise exceptions.AuthenticationFailed("Invalid username/password.")
        try:
            return super().authenticate_credentials(userid, password, request)
        except exceptions.AuthenticationFailed:
            if request is not None and getattr(request, "axes_locked_out", False):
                raise exceptions.Throttled(wait=retry_after(request), detail=(
                    "Too many failed sign-ins for this user from this address; the right password is refused "
                    "until the cool-off ends.")) from None
            raise


class LockoutAwareBasicScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of LockoutAwareBasicAuthentication: plain HTTP Basic."""

    target_class = "connector.api.lockout.LockoutAwareBasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "basic"}


class RequestAxesBackend(AxesStandaloneBackend):
    """django-axes' lock-out check for every sign-in that comes with a request (login form, admin, HTTP Basic).
    A check of credentials without a request (a management command, a shell) has no client address to count and
    is not a guessing channel of the web: it passes through to the next backend instead of failing."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
