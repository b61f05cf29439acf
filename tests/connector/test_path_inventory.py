"""The code-level path registry (connector.selectors.inventory.PATHS) is closed against the code (CV2-12-010, D-320):
every production V2 write service that takes the serving guard is registered under its path kind, and nothing else
is; every path kind of the seed's delivery gate 3 is present and names a real authority; every Catalog binding kind
maps to registered path kinds."""
from __future__ import annotations

import ast
import importlib
import pathlib
import sys

from connector.choices import BindingKind
from connector.selectors import inventory

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVICE_ROOTS = ("connector/services", "effects/services")
GUARD_CALLS = {"lock_serving", "lock_serving_accounts", "serving_check"}
GUARD_MODULE = "connector.services.guard"
SEED_KINDS = ("route", "partition", "account", "gate", "ingress", "replay", "materialization", "claim", "execution",
              "outbound", "dispatch")


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
    return names


def guard_callers(roots=SERVICE_ROOTS) -> set[str]:
    """Every top-level function (and class method) of the service modules whose body calls the serving guard."""
    found = set()
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module == GUARD_MODULE:
                continue  # the authority itself
            tree = ast.parse(path.read_text())
            for node in tree.body:
                functions = ([node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                             [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
                             if isinstance(node, ast.ClassDef) else [])
                for function in functions:
                    if _called_names(function) & GUARD_CALLS:
                        prefix = f"{module}.{node.name}." if isinstance(node, ast.ClassDef) else f"{module}."
                        found.add(prefix + function.name)
    return found


def _resolve(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_guarded_write_service_is_registered_and_only_those():
    """The set of service functions that call the serving guard equals the registry's services: a new guarded
    write path that is not registered (or a registered one that is gone or no longer guarded) fails here.
    Proves: CV2-12-010"""
    in_code = guard_callers()
    registered = inventory.guarded_services()
    assert in_code, "the scan found no guarded service: the scan itself is broken"
    assert not in_code - registered, f"guarded write services missing from the registry: {sorted(in_code - registered)}"
    assert not registered - in_code, f"registered services that do not take the guard: {sorted(registered - in_code)}"


def test_the_scan_finds_an_unregistered_guarded_service(tmp_path, monkeypatch):
    """The closure check is not vacuous: a new service module that takes the guard is found by the scan and is not
    in the registry. Proves: CV2-12-010"""
    package = tmp_path / "connector" / "services"
    package.mkdir(parents=True)
    (package / "rogue.py").write_text(
        "from connector.services.guard import lock_serving\n\n\n"
        "def rogue_write(account_id):\n    lock_serving(account_id=account_id)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = guard_callers(("connector/services",))
    assert found == {"connector.services.rogue.rogue_write"}
    assert not found <= inventory.guarded_services()


def test_every_seed_path_kind_names_a_real_authority_and_every_binding_kind_is_mapped():
    """The registry lists exactly the eleven path kinds of delivery gate 3, each naming an importable authority
    function and importable services; every BindingKind maps to registered path kinds. Proves: CV2-12-010"""
    assert inventory.PATH_KINDS == SEED_KINDS
    for path in inventory.PATHS:
        assert callable(_resolve(path.authority)), path
        for service in path.services:
            module, _, name = service.rpartition(".")
            assert hasattr(importlib.import_module(module), name), service
    assert set(inventory.BINDING_PATHS) == set(BindingKind.values)
    for kinds in inventory.BINDING_PATHS.values():
        assert kinds and set(kinds) <= set(SEED_KINDS)


def test_the_activation_inventory_names_every_path_without_its_authority(db):
    """The per-activation inventory from the database: on a covered service every account, gate, enabled route
    and mapped credential is an entry with its authority; an account whose gate is gone, gates not
    `v2_validating`, an enabled route without its frozen binding and a certified partition without a lane are each
    listed uncovered. Proves: CV2-12-010"""
    from django.db import connection

    from connector.demo import build_world
    from connector.models import AccountServingGate, ServiceConfigurationAccount
    from tests import dbroles

    world = build_world("inv-")
    epoch = world.verified_epoch  # the candidate; the gates serve epoch-1 (v2_serving, not v2_validating)
    accounts = sorted(a.pk for a in world.accounts)
    found = inventory.activation_inventory(epoch_pk=epoch.pk, configuration_pk=world.configuration.pk,
                                           partitions=[(accounts[0], "records.webhook", "nowhere")])
    kinds = found.counts()
    assert kinds["account"] == len(accounts) and kinds["route"] >= len(accounts) and kinds["dispatch"] >= 1
    uncovered = {(kind, subject) for kind, subject, _ in found.uncovered}
    gates = dict(AccountServingGate.objects.values_list("account_id", "pk"))
    assert {("gate", str(gates[a])) for a in accounts} <= uncovered  # v2_serving, not to be bound
    assert ("partition", f"{accounts[0]}:records.webhook:nowhere") in uncovered

    with connection.cursor() as cursor:  # stage an account without its gate and a route outside the epoch
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM connector_accountservinggate WHERE account_id = %s", [accounts[1]])
        cursor.execute("UPDATE connector_serviceconfigurationaccount SET enabled_routes = %s "
                       "WHERE generation_id = %s AND account_id = %s",
                       ['["records.webhook", "no.such.route"]', world.configuration.pk, accounts[0]])
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)
    assert ServiceConfigurationAccount.objects.filter(account_id=accounts[0]).exists()
    found = inventory.activation_inventory(epoch_pk=epoch.pk, configuration_pk=world.configuration.pk)
    uncovered = {(kind, subject): reason for kind, subject, reason in found.uncovered}
    assert uncovered[("account", str(accounts[1]))] == "no serving gate"
    assert ("route", f"{accounts[0]}:no.such.route") in uncovered
    assert ["account", str(accounts[1])] not in [e[:2] for e in found.entries]
