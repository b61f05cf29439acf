import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.production")
application = get_wsgi_application()

# Each gunicorn worker loads the app after its fork: the OpenTelemetry SDK when OTEL_TRACES_EXPORTER asks for it.
from observability.tracing import configure  # noqa: E402

configure()
