"""One effect model (decision D-330): the V2 replacements of V1's outbound paths (a WorkItem's continuation push and
a root request) are both OutboundCommand + RemoteEffect authored through `effects.services.outbound`; V2 never
reads the V1 implementation; one external effect has exactly one lifecycle authority, which PostgreSQL enforces;
and REST bulk delivery, the product's separate contract, shares no effect with it (CV2-10-046)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.apps import apps
from django.db import IntegrityError, transaction
from django_fsm import FSMField

from effects.models import OutboundCommand, RemoteEffect
from tests.effects.helpers import author

ROOT = Path(__file__).resolve().parents[2]
V2_EFFECT_PACKAGES = ("connector", "effects")
# A table named in SQL (a table name as data, e.g. connector/placement.py's map of tables, is not a read of it).
SQL_TABLE = r'(FROM|JOIN|UPDATE|INTO|TABLE)\s+"?{table}\b'
# The modules that may create the connector's effect authority rows, and nothing else in the product.
AUTHORING_MODULES = {"effects/services/outbound.py"}


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.parts:
            yield str(path.relative_to(ROOT)), path.read_text()


def _imported(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "import_string", "__import__") and node.args and isinstance(
                node.args[0], ast.Constant):
            names.append(str(node.args[0].value))  # a dynamic import by a literal name counts too
    return names


def test_v2_effect_paths_never_read_the_v1_implementation():
    """No module of connector/ or effects/ imports the V1 implementation (`v1`), statically or by a literal
    dynamic import, nor `cutover` (whose port is the only road to the V1 owner); none reads the V1 owner setting
    or names a V1 model or a V1 table: the V2 push and its delivery to the provider are decided by V2 rows alone,
    so V1's effects can never be a second source of truth for a V2 effect. Proves: CV2-10-046"""
    v1_models = list(apps.get_app_config("v1").get_models())
    v1_names = {m.__name__ for m in v1_models}
    v1_tables = {m._meta.db_table for m in v1_models}
    offenders = []
    for package in V2_EFFECT_PACKAGES:
        for path, text in _modules(package):
            tree = ast.parse(text)
            offenders += [f"{path}: imports {name}" for name in _imported(tree)
                          if name.split(".")[0] in ("v1", "cutover")]
            offenders += [f"{path}: names {node.id if isinstance(node, ast.Name) else node.attr}"
                          for node in ast.walk(tree)
                          if (isinstance(node, ast.Name) and node.id in v1_names | {"CUTOVER_V1_OWNER"})
                          or (isinstance(node, ast.Attribute) and node.attr in v1_names | {"CUTOVER_V1_OWNER"})]
            offenders += [f"{path}: {s.value!r}" for s in ast.walk(tree) if isinstance(s, ast.Constant)
                          and isinstance(s.value, str) and (s.value == "CUTOVER_V1_OWNER" or any(
                              re.search(SQL_TABLE.format(table=t), s.value, re.I) for t in v1_tables))]
    assert offenders == []


def test_only_the_outbound_services_author_the_effect_authority():
    """Exactly one authoring path: only `effects/services/outbound.py` creates OutboundCommand or RemoteEffect
    rows anywhere in the product (by the ORM or the set-based insert); the REST
    bulk delivery modules never name them, and the outbound modules never name a delivery operation.
    Proves: CV2-10-046"""
    creators, crossings = set(), []
    for package in ("connector", "effects", "cutover", "governance", "observability"):
        for path, text in _modules(package):
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                        "create", "bulk_create", "get_or_create", "update_or_create") and isinstance(
                        node.func.value, ast.Attribute) and isinstance(node.func.value.value, ast.Name) and (
                        node.func.value.value.id in ("OutboundCommand", "RemoteEffect")):
                    creators.add(path)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("_insert_rows", "insert_rows") and node.args and (
                        getattr(node.args[0], "id", "") in ("OutboundCommand", "RemoteEffect")):
                    creators.add(path)
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            if "/delivery/" in path or path.endswith("admin_delivery.py"):
                crossings += [f"{path}: {n}" for n in names & {"OutboundCommand", "RemoteEffect", "DispatchPermit"}]
            if path in AUTHORING_MODULES or path.endswith(("dispatch.py", "runtime_bridge.py")):
                crossings += [f"{path}: {n}" for n in names if n.startswith("Delivery")]
    assert creators and creators <= AUTHORING_MODULES, creators
    assert crossings == []


def test_no_second_lifecycle_authority_relates_to_an_outbound_effect():
    """RemoteEffect is the only model with a lifecycle state (an FSM field) that refers to OutboundCommand, and
    no REST bulk delivery model relates to OutboundCommand, RemoteEffect or their attempts and permits (nor they
    to it): a connector external effect has no second stateful row anywhere. Proves: CV2-10-046"""
    effect_family = {apps.get_model("effects", n) for n in ("OutboundCommand", "RemoteEffect",
                                                              "RemoteEffectAttempt", "DispatchPermit")}
    stateful_on_command = sorted(
        m._meta.label for m in apps.get_models()
        if any(isinstance(f, FSMField) for f in m._meta.concrete_fields)
        and any(f.is_relation and f.concrete and f.related_model is OutboundCommand for f in m._meta.get_fields()))
    assert stateful_on_command == ["effects.RemoteEffect"]
    delivery = {m for m in apps.get_app_config("effects").get_models()
                if m.__module__.startswith("effects.models.delivery")}
    assert delivery and not delivery & effect_family
    crossing = [f"{m._meta.label}.{f.name}" for m in delivery | effect_family for f in m._meta.get_fields()
                if f.is_relation and f.related_model is not None
                and ((m in delivery and f.related_model in effect_family)
                     or (m in effect_family and f.related_model in delivery))]
    assert crossing == []


@pytest.mark.django_db
def test_one_external_effect_has_exactly_one_lifecycle_authority(push_world):
    """Authoring the same logical effect again returns the same command and the same RemoteEffect; PostgreSQL
    refuses a second RemoteEffect for one OutboundCommand (the unique foreign key) and a second OutboundCommand
    for one logical effect (account, scope, EffectRoot, EffectSlot, EffectGeneration), so one external effect can
    never have two lifecycle authorities, whatever code path tries. Proves: CV2-10-046"""
    account = push_world.accounts[0]
    command = author(account)
    effect = RemoteEffect.objects.get(command=command)
    again = author(account)
    assert (again.pk, RemoteEffect.objects.get(command=again).pk) == (command.pk, effect.pk)
    assert (OutboundCommand.objects.count(), RemoteEffect.objects.count()) == (1, 1)

    with pytest.raises(IntegrityError) as info, transaction.atomic():
        RemoteEffect.objects.create(command=command, logical_effect_digest=bytes(effect.logical_effect_digest),
                                    account_id=effect.account_id)
    assert "command" in info.value.__cause__.diag.constraint_name
    fields = {f.attname: getattr(command, f.attname) for f in OutboundCommand._meta.concrete_fields
              if f.attname not in ("id", "created_at")}
    with pytest.raises(IntegrityError) as info, transaction.atomic():
        OutboundCommand.objects.create(**{**fields, "idempotency_key": b"\x01" * 32})
    assert info.value.__cause__.diag.constraint_name == "effects_command_unique_logical_effect"
    assert (OutboundCommand.objects.count(), RemoteEffect.objects.count()) == (1, 1)
