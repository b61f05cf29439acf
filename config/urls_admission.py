"""The URLconf of config/wsgi.py's admission dispatch (D-540): only the signed transport admission, under the same
name as in config.urls (`connector-api:receipt-admit`), and the API's JSON NOT_FOUND for anything else."""
from django.urls import include, path, re_path

from connector.api.urls import api_not_found
from connector.api.admission_direct import receipt_admit_direct

admission_patterns = [
    path("v2/accounts/<str:account>/channels/<str:channel>/receipts", receipt_admit_direct, name="receipt-admit"),
    re_path(r"^[\s\S]*$", api_not_found, name="not-found"),
]

urlpatterns = [
    path("api/", include((admission_patterns, "connector-api"))),
]
