import pytest
from tests.connector.test_invariants import *  # noqa
@pytest.mark.django_db
def test_peek(traffic):
    c_permit_foreign_gate(traffic); c_high_water_ahead(traffic)
    print(run_command()[1]); print(run_command("--json")[1])
