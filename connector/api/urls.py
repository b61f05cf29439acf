"""Connector V2 API routes, mounted under /api/ by config/urls.py (docs/api.md)."""
from django.urls import path

from connector.api.views import ReceiptAdmitApi, ReceiptDetailApi, ReceiptEventListApi, ReplayRequestAdmitApi

app_name = "connector-api"

urlpatterns = [
    path("v2/accounts/<str:account>/channels/<str:channel>/receipts", ReceiptAdmitApi.as_view(),
         name="receipt-admit"),
    path("v2/accounts/<str:account>/replays", ReplayRequestAdmitApi.as_view(), name="replay-request-admit"),
    path("v2/accounts/<str:account>/receipts/<int:receipt_id>", ReceiptDetailApi.as_view(), name="receipt-detail"),
    path("v2/accounts/<str:account>/receipts/<int:receipt_id>/events", ReceiptEventListApi.as_view(),
         name="receipt-event-list"),
]
