"""The WSGI application gunicorn serves (config/gunicorn.py): Django's handler, with the signed transport admission
POST dispatched to a handler of its own (D-540).

`POST /api/v2/accounts/<account>/channels/<channel>/receipts` is a machine-to-machine request authenticated only by
its HMAC signature: it goes to a Django handler whose middleware is settings.ADMISSION_MIDDLEWARE (admission metrics
and the security headers) and whose URLconf is settings.ADMISSION_URLCONF (the admission view without DRF's
request machinery, connector.api.admission_direct.receipt_admit_direct). Every other request, including other
methods on that path, goes to the whole stack of settings.MIDDLEWARE and config.urls."""
import os
import re

from django.core.handlers.wsgi import WSGIHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")

#: The admission route of connector/api/urls.py (`<str:...>` is `[^/]+`), matched on PATH_INFO.
ADMISSION_PATH = re.compile(r"/api/v2/accounts/[^/]+/channels/[^/]+/receipts")


class AdmissionHandler(WSGIHandler):
    """Django's WSGI handler with the admission's own middleware and URLconf."""

    def load_middleware(self, is_async=False):
        from django.conf import settings

        saved = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.ADMISSION_MIDDLEWARE
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = saved

    def resolve_request(self, request):
        from django.conf import settings

        request.urlconf = settings.ADMISSION_URLCONF
        return super().resolve_request(request)


class AdmissionDispatch:
    """Route the admission POST to `admission`, everything else to `whole`."""

    def __init__(self, whole, admission) -> None:
        self.whole, self.admission = whole, admission

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") == "POST" and ADMISSION_PATH.fullmatch(environ.get("PATH_INFO", "")):
            return self.admission(environ, start_response)
        return self.whole(environ, start_response)


application = AdmissionDispatch(get_wsgi_application(), AdmissionHandler())

# Each gunicorn worker loads the app after its fork: the OpenTelemetry SDK when OTEL_TRACES_EXPORTER asks for it.
from observability.tracing import configure  # noqa: E402

configure()
