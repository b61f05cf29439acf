import pytest
from django.contrib.auth.models import Group, User

from tests.effects.conftest import push_world, receiver  # noqa: F401  (fixtures)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/governance/" in str(item.fspath) and item.get_closest_marker("django_db") is None:
            item.add_marker(pytest.mark.django_db(databases=["default", "journal"]))


@pytest.fixture
def people(db):
    """One user per role (the groups exist after migrate), plus a second certifier and a user with no role."""
    def make(name, *groups):
        user = User.objects.create_user(name, password="pw-" + name)
        for group in groups:
            user.groups.add(Group.objects.get(name=group))
        return User.objects.get(pk=user.pk)

    return {"auditor": make("ann-auditor", "auditor"), "operator": make("oscar-operator", "operator"),
            "approver": make("alma-approver", "approver"), "certifier": make("cid-certifier", "certifier"),
            "certifier2": make("cora-certifier", "certifier"), "nobody": make("ned-nobody")}
