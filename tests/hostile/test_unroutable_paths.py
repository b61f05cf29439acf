"""Every /api/ path no route matches answers the catalog's JSON NOT_FOUND, including paths whose decoded
segments contain a newline (found by the schema fuzzer: the catch-all's `.` did not match `\\n`, so Django's HTML
404 page answered)."""
import pytest


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/v2/accounts/0/receipts/%0A", "/api/v2/accounts/a/receipts/1%0A/events",
                                  "/api/nowhere", "/api/v2/accounts/0/receipts/%0D%0A/x"])
def test_unroutable_api_paths_answer_json_not_found(client, path):
    response = client.get(path)
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"
