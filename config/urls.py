from django.contrib import admin
from django.urls import include, path
from csp.decorators import csp_update
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from django.contrib.auth import views as auth_views

urlpatterns = [
    path("", include("governance.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The rendered API docs load Redoc and its fonts from their CDNs: the one page whose CSP allows them.
    path("api/docs/", csp_update({"script-src": ["https://cdn.jsdelivr.net"], "worker-src": ["blob:"],
                                  "style-src": ["https://fonts.googleapis.com"],
                                  "font-src": ["https://fonts.gstatic.com"]})(
        SpectacularRedocView.as_view(url_name="api-schema")), name="api-docs"),
    path("api/", include("connector.api.urls")),
]
