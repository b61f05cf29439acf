"""The API's one EXCEPTION_HANDLER (STYLE R14) and its closed catalog of error codes.

Every error body is `{"code": <one of API_ERROR_CODES>, "detail": <text, or field errors for REQUEST_INVALID>}`.
Domain errors (`connector.errors.ConnectorError` and subclasses) keep their own code, message and HTTP status;
a retryable 503 also carries `Retry-After`. DRF and Django errors map to the generic codes below. The catalog is
the single source of the table in docs/api.md and of the `code` enum in the OpenAPI schema (a test compares all
three)."""
from __future__ import annotations

import logging
from types import MappingProxyType

from django.core.exceptions import RequestDataTooBig
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from connector.errors import ConnectorError

log = logging.getLogger(__name__)

#: Seconds a client should wait before retrying a retryable 503 (the gate is not serving, a secret or owner read
#: is unavailable). Short: halts and successor activations are operator actions measured in seconds to minutes.
RETRY_AFTER_SECONDS = 5

#: code -> (HTTP status, meaning). Closed: the handler emits only these codes for the API's own endpoints.
API_ERROR_CODES = MappingProxyType({
    # Generic request errors (DRF / Django).
    "REQUEST_INVALID": (400, "The request body or a parameter is malformed (field errors in `detail`)."),
    "NOT_AUTHENTICATED": (401, "No valid Django credentials (HTTP Basic or a session) were presented."),
    "PERMISSION_DENIED": (403, "The authenticated user lacks the model permission this endpoint requires."),
    "NOT_FOUND": (404, "No such URL, or no such receipt in this account."),
    "METHOD_NOT_ALLOWED": (405, "The HTTP method is not supported by this endpoint."),
    "NOT_ACCEPTABLE": (406, "The `Accept` header excludes JSON, the only media type replay and reads render."),
    "BODY_TOO_LARGE": (413, "The body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE; nothing was written."),
    "UNSUPPORTED_MEDIA_TYPE": (415, "The replay endpoint accepts `application/json` only."),
    "TOO_MANY_ATTEMPTS": (429, "Too many failed HTTP Basic sign-ins for this user from this address: every "
                               "request of the pair is refused, the right password included, until `Retry-After` "
                               "seconds have passed."),
    "DATABASE_UNAVAILABLE": (503, "The database cannot be reached right now (restart, failover); nothing was "
                                  "written by this request. Retry after `Retry-After` seconds."),
    "INTERNAL_ERROR": (500, "An unexpected server error; it is logged. Retrying the same request is safe."),
    # Domain errors (connector.errors.ConnectorError subclasses), status from the exception class.
    "ACCOUNT_NOT_FOUND": (404, "No connector account has that exact key."),
    "CHANNEL_NOT_FOUND": (404, "The account's active epoch has no enabled inbound route with that channel name."),
    "SIGNATURE_INVALID": (401, "Connector-Signature is missing, malformed, outside the time tolerance, or wrong."),
    "NONCANONICAL_KEY": (400, "Idempotency-Key is missing, empty, padded, not UTF-8 or otherwise non-canonical."),
    "BODY_UNPARSEABLE": (400, "The route cannot parse the body; the delivery is refused as a whole."),
    "RECEIPT_DIGEST_MISMATCH": (409, "The idempotency key was accepted (by V2 or V1) with different bytes."),
    "IDENTITY_INVALID": (400, "An identity (replay request_id, principal) is not canonical."),
    "REPLAY_MODE_REFUSED": (400, "Only `suppress_external_effects` replays are accepted."),
    "REPLAY_MISMATCH": (409, "The replay request ID exists with different bytes."),
    "REPLAY_PREDECESSOR_INVALID": (422, "The predecessor event and payload digest do not match exactly, both or "
                                        "neither predecessor form was given, or the V1 predecessor ref is malformed "
                                        "(protocol, identities, V1 epoch, digests or bytes)."),
    "REPLAY_V1_PREDECESSOR_UNKNOWN": (422, "The V1 predecessor ref matches no V1 acceptance tombstone of the account "
                                           "exactly (V1 receipt, work item and authorized payload digest)."),
    "REPLAY_REQUEST_INVALID": (409, "The replay has no reason, or its target epoch is not the account's serving "
                                    "epoch (not retryable: correct the request)."),
    "SIGNING_CREDENTIAL_UNAVAILABLE": (503, "The account's signing credential cannot be read right now (server "
                                            "side); retry after `Retry-After` seconds."),
    "GATE_NOT_SERVING": (503, "The account gate is not v2_serving on an exact active epoch; retry after "
                              "`Retry-After` seconds."),
    "OWNER_UNAVAILABLE": (503, "An owner or the secret backend cannot be read right now; retry after "
                               "`Retry-After` seconds."),
    "OWNER_FACT_INVALID": (400, "An owner fact (e.g. the signing secret version) is absent or malformed; an "
                                "operator must fix the configuration."),
    "ROUTE_DEFINITION_INVALID": (500, "The frozen route definition is not of the closed generic shape; an "
                                      "operator must install a corrected pack generation."),
    # Refusals of the web server itself (config/webserver.py, decision D-161), before the app runs; the server
    # closes the connection after answering.
    "REQUEST_MALFORMED": (400, "The request line or a header is not valid HTTP/1.1 (or names an unsupported "
                               "`Expect`); nothing was read further."),
    "LENGTH_REQUIRED": (411, "A request body must be framed by `Content-Length`; `Transfer-Encoding` is refused."),
    "URI_TOO_LONG": (414, "The request line exceeds the web server's limit."),
    "HEADERS_TOO_LARGE": (431, "A header field, or the number of header fields, exceeds the web server's limits."),
})

#: The codes as a sorted list (the `code` enum of the OpenAPI `Error` component).
API_ERROR_CODE_CHOICES = sorted(API_ERROR_CODES)

# DRF exception class -> catalog code, most specific first.
_DRF_CODES: tuple[tuple[type[exceptions.APIException], str], ...] = (
    (exceptions.ValidationError, "REQUEST_INVALID"),
    (exceptions.ParseError, "REQUEST_INVALID"),
    (exceptions.NotAuthenticated, "NOT_AUTHENTICATED"),
    (exceptions.AuthenticationFailed, "NOT_AUTHENTICATED"),
    (exceptions.PermissionDenied, "PERMISSION_DENIED"),
    (exceptions.NotFound, "NOT_FOUND"),
    (exceptions.MethodNotAllowed, "METHOD_NOT_ALLOWED"),
    (exceptions.NotAcceptable, "NOT_ACCEPTABLE"),
    (exceptions.UnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE"),
    (exceptions.Throttled, "TOO_MANY_ATTEMPTS"),
)


class BodyTooLarge(exceptions.APIException):
    """The request body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE; nothing was written."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large; nothing was written."
    default_code = "BODY_TOO_LARGE"


def _code_for(exc: exceptions.APIException) -> str:
    if isinstance(exc, BodyTooLarge):
        return "BODY_TOO_LARGE"
    for cls, code in _DRF_CODES:
        if isinstance(exc, cls):
            return code
    return "REQUEST_INVALID" if exc.status_code < 500 else "INTERNAL_ERROR"


def connector_exception_handler(exc: Exception, context: dict) -> Response:
    """Map every exception a view raises to one catalog body. Unexpected exceptions are logged, reported through
    Django's `got_request_exception` signal (error reporters, the test client) and answered 500 INTERNAL_ERROR."""
    if isinstance(exc, ConnectorError):
        set_rollback()
        headers = {}
        if exc.retryable and exc.http_status == status.HTTP_503_SERVICE_UNAVAILABLE:
            headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return Response({"code": exc.code, "detail": exc.detail}, status=exc.http_status, headers=headers)
    if isinstance(exc, RequestDataTooBig):  # Django's size limit, wherever the body was first read
        exc = BodyTooLarge()
    if isinstance(exc, (OperationalError, InterfaceError)):  # the database is unreachable or restarting
        set_rollback()
        log.warning("database unavailable in API view", exc_info=exc)
        return Response({"code": "DATABASE_UNAVAILABLE", "detail": API_ERROR_CODES["DATABASE_UNAVAILABLE"][1]},
                        status=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    response = drf_exception_handler(exc, context)  # Http404/PermissionDenied conversion, WWW-Authenticate
    if response is None:
        request = context.get("request")
        log.error("unexpected error in API view %s", type(context.get("view")).__name__, exc_info=exc)
        got_request_exception.send(sender=None, request=getattr(request, "_request", request))
        return Response({"code": "INTERNAL_ERROR", "detail": API_ERROR_CODES["INTERNAL_ERROR"][1]},
                        status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    if isinstance(exc, exceptions.APIException):
        detail = exc.detail
    else:  # django.http.Http404 or django.core.exceptions.PermissionDenied, converted by DRF above
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else response.data
        exc = exceptions.NotFound() if response.status_code == 404 else exceptions.PermissionDenied()
    response.data = {"code": _code_for(exc), "detail": detail}
    return response
