"""What every view of the connector API shares (connector.api.views): the raw-body parser and JSON-only
negotiation of transport admission, the operator endpoints' authentication and model-permission classes, and the
OpenAPI descriptions of the errors and parameters the endpoints have in common (docs/api.md)."""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.authentication import SessionAuthentication
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission

from connector.api.exceptions import RETRY_AFTER_SECONDS
from connector.api.lockout import LockoutAwareBasicAuthentication
from connector.api.serializers import ErrorSerializer


class RawBodyParser(BaseParser):
    """Any content type, handed over as the exact bytes. Admission never parses through DRF: the route's frozen
    definition parses the body inside the service, and the signature covers the bytes as received."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None) -> bytes:
        return stream.read() if stream is not None else b""


def model_permission(perm: str) -> type[BasePermission]:
    """A DRF permission class requiring one Django model permission (global, not per account)."""

    class HasModelPermission(BasePermission):
        message = f"This endpoint requires the permission {perm}."

        def has_permission(self, request, view) -> bool:
            user = request.user
            return bool(user and user.is_authenticated and user.has_perm(perm))

    HasModelPermission.__name__ = HasModelPermission.__qualname__ = f"Has_{perm.replace('.', '_')}"
    return HasModelPermission


# Basic first: 401 + WWW-Authenticate; a locked-out user/address pair gets 429 + Retry-After (connector.api.lockout)
OPERATOR_AUTHENTICATION = [LockoutAwareBasicAuthentication, SessionAuthentication]


class JsonRegardlessOfAccept(BaseContentNegotiation):
    """Admission answers JSON whatever the sender's `Accept` header says: a delivery is never refused (406) for
    how the sender would like to read the acknowledgement."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def error_response(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


COMMON_ERRORS = {
    405: error_response("`METHOD_NOT_ALLOWED`."),
    500: error_response("`INTERNAL_ERROR`: unexpected, logged."),
}
OPERATOR_ERRORS = {
    401: error_response("`NOT_AUTHENTICATED`: no valid HTTP Basic credentials or session."),
    403: error_response("`PERMISSION_DENIED`: the user lacks the required model permission (or a session POST lacks "
                "its CSRF token)."),
    406: error_response("`NOT_ACCEPTABLE`: the endpoint renders JSON only."),
    429: error_response("`TOO_MANY_ATTEMPTS`: too many failed HTTP Basic sign-ins for this user from this address; "
                "retry after `Retry-After` seconds (docs/security.md)."),
}
RETRY_AFTER = OpenApiParameter(
    "Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[503],
    description=f"Seconds to wait before retrying ({RETRY_AFTER_SECONDS}).")
ACCOUNT_PARAM = OpenApiParameter("account", OpenApiTypes.STR, OpenApiParameter.PATH,
                                 description="The exact connector account key.")
