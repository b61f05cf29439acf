"""The layout shows the architecture (issue 22, D-259, D-260, D-266): app boundaries are held by import-linter, no
product module grows past what one reader can hold, one package of a name per layer, no test or demo server in
the product packages, one thread-race helper for the tests, and migrations that match the models. No test here
needs the database."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support import scaled

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_PACKAGES = ("connector", "effects", "cutover", "governance", "observability", "v1", "bench", "config")
MAX_LINES = 500

# Modules over MAX_LINES today, each with why it is not split yet. The test fails when one of them shrinks
# under the limit (delete its entry) or disappears, so the list only gets shorter (D-260).
ALLOWED_OVER: dict[str, str] = {}

BOUNDARY_CONTRACTS = (
    "connector is the bottom layer: it imports neither effects nor cutover",
    "effects never imports cutover",
    "other apps reach connector only through its services, selectors and the shared kernel",
    "other apps reach effects only through its services and selectors",
    "other apps reach cutover only through its services, selectors and ports",
    "the shared kernel sits below every app's interfaces",
    "no import cycles",
    "the delivery contract layer is pure: it imports no effects layer above it",
    "no product package imports the demo",
    "the demo imports no product package (it stands alone, without Django)",
)

# The Django apps whose layers are checked for one package of a name per layer, and the layer directories inside
# an app; a package directly under the app (effects/delivery/) is the app's own pure layer (D-266).
APPS = ("connector", "effects", "cutover", "governance", "observability", "v1")
LAYERS = ("models", "services", "selectors", "admin", "api", "management", "interpreters", "kernel", "canonical")
# Every package named `delivery`, with its layer: the test fails on another one, so a new layer's delivery
# code is a reviewed change.
DELIVERY_PACKAGES = {
    "effects/delivery": "the delivery contract layer (pure)",
    "effects/models/delivery": "models",
    "effects/services/delivery": "services",
}
# The product packages may not serve HTTP themselves: a test receiver lives in tests/, the demo's in demo/.
# (bench is the measuring harness, outside the product as tests are: its OTLP sink stays in it.)
PRODUCT_APPS_AND_CONFIG = (*APPS, "config")
SERVER = re.compile(r"\b(http\.server|socketserver|HTTPServer|serve_forever)\b")
# Thread-race helpers: `tests/concurrency.py` is the one place a test releases threads together. The files below
# still build their own barrier, each for the reason given; the test fails when one of them no longer does, so
# the list only shrinks.
BARRIER = re.compile(r"\bthreading\.Barrier\(|\bBarrier\(")
BARRIER_ALLOWED = {
    "tests/concurrency.py": "the shared helper itself (run_concurrently)",
    "tests/connector/test_claim_batch.py": "being rewritten by the batched-claim work in parallel (route2): convert "
                                           "to run_concurrently after it lands",
    "tests/effects/test_permits_and_revocation.py": "one of three orderings of one race; the other two start the "
                                                    "same two workers in turn (tests.concurrency.start, a Gate), and "
                                                    "the assertions read both workers' error and result",
}


# Function-local imports of project modules (issue 39 item 4, D-513): product code imports at module top. The
# imports below stay inside their function, each for the reason given; a new one fails the test unless it is
# listed here with its reason, and a listed one that moved to the top (or is gone) must leave the list.
# Keys: "<path>: from <module> import <names>", the statement as written (names sorted as written).
LOCAL_IMPORT_ROOTS = ("connector", "effects", "cutover", "governance", "observability", "v1", "config", "demo",
                      "bench")
LOCAL_IMPORT_SCOPE = ("connector", "effects", "cutover", "governance", "observability", "v1", "config", "scripts")
APP_LOADING = ("app loading: Django imports every apps.py before the model registry is ready, and these modules "
               "read the models, so AppConfig.ready() imports them")
LOCAL_IMPORTS_ALLOWED = {
    "connector/apps.py: from connector import identity": APP_LOADING,
    "effects/apps.py: from connector.services import approvals": APP_LOADING,
    "effects/apps.py: from effects import selectors": APP_LOADING,
    "effects/apps.py: from effects.services import dispatch, identity, intents, runtime_bridge": APP_LOADING,
    "cutover/apps.py: from connector.services import approvals": APP_LOADING,
    "cutover/apps.py: from cutover import selectors": APP_LOADING,
    "cutover/apps.py: from cutover.services import approval_subjects, first_activation, v1_shutdown": APP_LOADING,
    "governance/apps.py: from governance.roles import sync_roles_after_migrate": APP_LOADING,
    "observability/workers.py: from observability.metrics import add_counted": (
        "settings read at import: the config package imports config.celery, which imports this module before "
        "Django's settings are configured; observability.metrics imports observability.readings, which reads the "
        "models"),
    "scripts/services.py: from connector import dbroles": (
        "the script runs from any directory without the checkout on sys.path: _dbroles() puts the root on it first"),
}


def _local_project_imports(path: Path, roots: tuple[str, ...]) -> list[str]:
    """Every `import` or `from ... import` of a project module (a relative import counts) inside a function of the
    module at `path`, as "<path>: <statement>"."""
    relative = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.level or node.module.split(".")[0] in roots):
                names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
                found[id(node)] = f"{relative}: from {'.' * node.level}{node.module or ''} import {names}"
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] in roots for a in node.names):
                found[id(node)] = f"{relative}: import {', '.join(a.name for a in node.names)}"
    return list(found.values())


def _scoped_sources(packages: tuple[str, ...]):
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "/migrations/" not in path.relative_to(ROOT).as_posix():
                yield path


def test_no_function_local_import_of_a_project_module_outside_the_allow_list():
    """Product code (the apps, config and scripts; not migrations, tests or the benches) imports the project's
    modules at module top: a function-local import is allowed only where app loading or settings read at import
    forbid the top, and each such import is listed with its reason (issue 39 item 4, D-513). A listed import that
    is gone must leave the list."""
    found = [line for path in _scoped_sources(LOCAL_IMPORT_SCOPE)
             for line in _local_project_imports(path, LOCAL_IMPORT_ROOTS)]
    extra = sorted(set(found) - set(LOCAL_IMPORTS_ALLOWED))
    assert not extra, ("move these imports to the module top, or list them in LOCAL_IMPORTS_ALLOWED with the cycle "
                       f"or app-loading reason that keeps them local: {extra}")
    stale = sorted(set(LOCAL_IMPORTS_ALLOWED) - set(found))
    assert not stale, f"remove these from LOCAL_IMPORTS_ALLOWED, they are no longer function-local: {stale}"


def _private_reexports(path: Path) -> list[str]:
    """The `_private` names a module imports under `# noqa: F401` (an import kept though unused: a re-export)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if not any("noqa" in line and "F401" in line for line in lines[node.lineno - 1:node.end_lineno]):
            continue
        found += [f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: {a.name}" for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_re_exports_a_private_name():
    """No product module re-exports a `_private` name (an import kept under `noqa: F401`): a caller imports a name
    from the module that owns it, and a name other modules use is public in its owner (issue 39 item 4, D-513)."""
    found = [hit for path in _scoped_sources((*PRODUCT_PACKAGES, "scripts")) for hit in _private_reexports(path)]
    assert not found, f"import these from their owner (or make them public there): {found}"


# A private name another product module uses: the module's own private shared inside one package, each listed with
# its reason (D-513). Keys: "<path>: <module>.<name>"; a listed use that is gone must leave the list.
PRIVATE_USES_ALLOWED = {
    **{f"connector/canonical/decoding.py: connector.canonical.encoding.{name}": (
        "the canonical encoding's internals, shared by the canonical package's decoder (one package, one format)")
       for name in ("_BYTES_TYPES", "_I64", "_U32", "_check_domain")},
    **{f"connector/canonical/shapes.py: connector.canonical.encoding.{name}": (
        "the canonical encoding's internals, shared by the canonical package's shapes (one package, one format)")
       for name in ("_ENCODED_TOKEN", "_freeze", "_write")},
}


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join((*package, *([node.module] if node.module else [])))


def _private_uses(path: Path) -> list[str]:
    """The `_private` names of other project modules that the module at `path` uses: imported by name
    (`from m import _x`) or read through an imported module (`m._x`). Model attributes such as `_meta` are not
    module names, so they are not counted."""
    relative = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules, found = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(path, node)
            if source.split(".")[0] not in LOCAL_IMPORT_ROOTS:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(f"{relative}: {source}.{alias.name}")
                elif _is_module(f"{source}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LOCAL_IMPORT_ROOTS and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.add(f"{relative}: {modules[node.value.id]}.{node.attr}")
    return sorted(found)


def test_no_product_module_uses_another_modules_private_name():
    """A name another product module uses is public in its owner: no product module imports or reads a `_private`
    name of another project module, except the listed uses inside one package (issue 39 item 4, D-513)."""
    found = [hit for path in _scoped_sources(LOCAL_IMPORT_SCOPE) for hit in _private_uses(path)]
    extra = sorted(set(found) - set(PRIVATE_USES_ALLOWED))
    assert not extra, f"make these names public in their owner (or stop using them from outside): {extra}"
    stale = sorted(set(PRIVATE_USES_ALLOWED) - set(found))
    assert not stale, f"remove these from PRIVATE_USES_ALLOWED, they are no longer used: {stale}"


def _product_modules() -> dict[str, int]:
    sizes = {}
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                continue
            with path.open(encoding="utf-8") as handle:
                sizes[relative] = sum(1 for _ in handle)
    return sizes


def test_no_product_module_is_over_the_line_limit():
    """Every product module outside migrations has at most MAX_LINES lines, except the listed ones; a listed one
    that is now short enough (or gone) must leave the list."""
    sizes = _product_modules()
    too_long = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in ALLOWED_OVER}
    assert not too_long, f"split these modules by responsibility (limit {MAX_LINES} lines): {too_long}"
    stale = {path: sizes.get(path) for path in ALLOWED_OVER if sizes.get(path, 0) <= MAX_LINES}
    assert not stale, f"remove these from ALLOWED_OVER, they are within the limit or gone: {stale}"


def test_the_boundary_contracts_are_declared_and_hold():
    """The import-linter configuration declares the app-boundary contracts, and `lint-imports` keeps them all.
    Proves the boundaries of docs/spec/ARCHITECTURE.md "Layout": between apps only services, selectors and the shared
    kernel; connector below effects below cutover; no cycles."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    names = {contract["name"] for contract in config["contracts"]}
    assert not set(BOUNDARY_CONTRACTS) - names, set(BOUNDARY_CONTRACTS) - names
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=scaled(300),
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    for name in BOUNDARY_CONTRACTS:
        assert f"{name} KEPT" in " ".join(result.stdout.split()), name


def _packages(root: Path) -> list[str]:
    return sorted(p.parent.relative_to(ROOT).as_posix() for p in root.rglob("__init__.py")
                  if "/migrations" not in p.parent.relative_to(ROOT).as_posix())


def _layer(package: str) -> str:
    """The app and layer a package belongs to: `effects/services/delivery` -> ("effects", "services")."""
    parts = package.split("/")
    return f"{parts[0]}/{parts[1]}" if len(parts) > 2 and parts[1] in LAYERS else f"{parts[0]}/"


def test_one_package_of_a_name_per_layer():
    """Inside an app, no two packages share a name within one layer (a second `delivery` under services/ or beside
    the contract layer is refused), and the `delivery` packages are exactly the listed ones, one per layer (issue
    22, "one delivery package per layer at most"; D-266)."""
    seen: dict[tuple[str, str], list[str]] = {}
    delivery = []
    for app in APPS:
        for package in _packages(ROOT / app):
            name = package.rsplit("/", 1)[-1]
            if package == app:
                continue
            seen.setdefault((_layer(package), name), []).append(package)
            if name == "delivery":
                delivery.append(package)
    twice = {key: found for key, found in seen.items() if len(found) > 1}
    assert not twice, f"one package of a name per layer: {twice}"
    assert sorted(delivery) == sorted(DELIVERY_PACKAGES), (
        f"the delivery packages are {sorted(delivery)}; one per layer, listed in DELIVERY_PACKAGES")
    assert len({_layer(p) for p in DELIVERY_PACKAGES}) == len(DELIVERY_PACKAGES)


def test_no_test_or_demo_receiver_in_the_product_packages():
    """No product module serves HTTP itself: the loopback receivers the tests use live in tests/ and the demo's
    (`make run`) in the top-level demo/ package, which no product package imports (import-linter, D-266). The
    demo receiver still runs as `python -m demo.receiver`, the command scripts/run.py starts."""
    servers = []
    for package in PRODUCT_APPS_AND_CONFIG:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in relative and SERVER.search(path.read_text(encoding="utf-8")):
                servers.append(relative)
    assert servers == [], f"a server in the product packages (move it to tests/ or demo/): {servers}"
    assert (ROOT / "demo" / "crm.py").exists() and (ROOT / "demo" / "receiver.py").exists()
    from scripts import run
    assert dict(run.children(0))["receiver"][1:3] == ["-m", "demo.receiver"]


def test_one_concurrency_helper_for_the_tests():
    """Tests release racing threads through tests/concurrency.py (`run_concurrently`); a barrier written again in a
    test file fails here unless it is listed with its reason, and a listed file that no longer needs its own
    barrier must leave the list (issue 22, "one concurrency helper for tests"; D-266)."""
    found = set()
    for path in (ROOT / "tests").rglob("*.py"):
        if BARRIER.search(path.read_text(encoding="utf-8")):
            found.add(path.relative_to(ROOT).as_posix())
    extra = found - set(BARRIER_ALLOWED)
    assert not extra, f"use tests.concurrency.run_concurrently instead of a barrier of your own: {sorted(extra)}"
    stale = set(BARRIER_ALLOWED) - found
    assert not stale, f"remove these from BARRIER_ALLOWED, they no longer build a barrier: {sorted(stale)}"


def test_the_migrations_match_the_models():
    """Every model change has its migration and no migration describes a model that is not in the code:
    `makemigrations --check` finds nothing to write (an index dropped from a model but left in a committed migration
    would change the schema every database gets without the models saying so)."""
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE") or "config.django.test"
    result = subprocess.run([sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=scaled(300),
                            env={**os.environ, "DJANGO_SETTINGS_MODULE": settings_module})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "No changes detected" in result.stdout


def test_the_benches_are_a_development_tool_not_the_product():
    """`bench/` is not installed with the product package and not an app of the product's settings: only the
    development and test settings install it, so `manage.py bench ...` runs from a checkout (issue 39 item 6, D-512)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert not [p for p in setuptools["packages"]["find"]["include"] if p.startswith("bench")]
    from config.django import base, local, test

    assert "bench" not in base.INSTALLED_APPS
    assert local.INSTALLED_APPS[-1] == test.INSTALLED_APPS[-1] == "bench"
