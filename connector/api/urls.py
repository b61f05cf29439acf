"""Connector V2 API routes, mounted under /api/ by config/urls.py (docs/api.md)."""
from django.urls import path, re_path
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import NotFound

from connector.api.views import (
    ReceiptAdmitApi,
    ReceiptDetailApi,
    ReceiptEventListApi,
    ReplayRequestAdmitApi,
    ReplayRequestDetailApi,
)

app_name = "connector-api"

urlpatterns = [
    path("v2/accounts/<str:account>/channels/<str:channel>/receipts", ReceiptAdmitApi.as_view(),
         name="receipt-admit"),
    path("v2/accounts/<str:account>/replays", ReplayRequestAdmitApi.as_view(), name="replay-request-admit"),
    path("v2/accounts/<str:account>/replays/<str:request_id>", ReplayRequestDetailApi.as_view(),
         name="replay-request-detail"),
    path("v2/accounts/<str:account>/receipts/<int:receipt_id>", ReceiptDetailApi.as_view(), name="receipt-detail"),
    path("v2/accounts/<str:account>/receipts/<int:receipt_id>/events", ReceiptEventListApi.as_view(),
         name="receipt-event-list"),
]


@extend_schema(exclude=True)
@api_view(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
@authentication_classes([])
@permission_classes([])
def api_not_found(request, *args, **kwargs):
    """Any /api/ URL no route matches answers the catalog's JSON NOT_FOUND, never an HTML page."""
    raise NotFound("no such API endpoint")


urlpatterns.append(re_path(r"^[\s\S]*$", api_not_found, name="not-found"))
