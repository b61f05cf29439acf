"""The admission POST as config/wsgi.py's admission dispatch serves it (D-540): ReceiptAdmitApi's admission without
DRF's request machinery, answering the same status, body bytes and headers."""
from __future__ import annotations

from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer

from connector.api.exceptions import connector_exception_handler
from connector.api.views import admit_signed_delivery

#: What DRF's APIView adds to every answer of ReceiptAdmitApi (`finalize_response`: its allowed methods; one renderer,
#: so no `Vary: Accept`); the direct route answers with the same headers (D-540).
ADMIT_ALLOW = "POST, OPTIONS"


def receipt_admit_direct(request, account: str, channel: str) -> HttpResponse:
    """The signed machine-to-machine POST as config/wsgi.py's admission dispatch serves it (D-540): the same checks
    in the same order as ReceiptAdmitApi.post (signature, key, serving guard, size limit, every refusal through the
    API's one exception handler and its catalog), the same status, body bytes and headers, without DRF's request
    wrapping, negotiation, authentication, permission and throttle steps and serializers, none of which this
    endpoint uses (no authentication classes, AllowAny, a raw body, JSON regardless of Accept)."""
    try:
        data, code = admit_signed_delivery(None, request, account, channel)
        response = HttpResponse(_RENDERER.render(data), status=code, content_type=_RENDERER.media_type)
        response.data = data  # observability.admission reads the outcome from it, as from a DRF Response
    except Exception as exc:  # noqa: BLE001 - the one handler maps every exception, as DRF's handle_exception does
        response = connector_exception_handler(exc, {"request": request, "view": None})
        response.accepted_renderer, response.accepted_media_type = _RENDERER, _RENDERER.media_type
        response.renderer_context = {"request": request, "response": response}
        response.render()
    response["Allow"] = ADMIT_ALLOW
    response["Content-Length"] = str(len(response.content))
    return response


_RENDERER = JSONRenderer()
