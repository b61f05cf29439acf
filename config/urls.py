from django.contrib import admin
from django.urls import include, path
from csp.decorators import csp_update
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from django.contrib.auth import views as auth_views

urlpatterns = [
    path("", include("observability.urls")),  # /healthz, /readyz, /metrics (docs/operations.md)
    path("", include("governance.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Redoc from the installed sidecar package (no CDN, D-163); its web worker runs from a blob: URL, and its
    # attribution logo is the one remote image it asks for.
    path("api/docs/", csp_update({"worker-src": ["blob:"], "img-src": ["https://cdn.redoc.ly"]})(
        SpectacularRedocView.as_view(url_name="api-schema", template_name="api/redoc.html")), name="api-docs"),
    path("api/", include("connector.api.urls")),
]
