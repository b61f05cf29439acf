"""The current-tree V1 egress manifest (CV2-12-020/021): every V1 provider-I/O call site, the authoritative V1
effect row it serves and the durable state committed before bytes may leave.

`scan()` walks the V1 package's source with `ast` and lists every function that calls an HTTP client (httpx,
requests, urllib.request, http.client, aiohttp). A call site found in the tree but absent from MANIFEST is
`untracked`, and an entry without a pre-I/O marker is unsupported: either makes the upgrade unsupported.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from cutover.ports import EgressManifest, ManifestEntry

PACKAGE_ROOT = Path(__file__).resolve().parent
HTTP_CLIENTS = ("httpx", "requests", "urllib.request", "http.client", "aiohttp")

MANIFEST: tuple[ManifestEntry, ...] = (
    ManifestEntry(call_site="v1.egress:send", effect_table="v1_v1outboundeffect", pre_io_marker="dispatching"),
)


def _client_names(tree: ast.AST) -> set[str]:
    """Local names bound to an HTTP client module or one of its members."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in HTTP_CLIENTS or alias.name.split(".")[0] in ("httpx", "requests", "aiohttp"):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in HTTP_CLIENTS or node.module.split(".")[0] in ("httpx", "requests", "aiohttp"):
                names.update(alias.asname or alias.name for alias in node.names)
            elif node.module in ("urllib", "http"):
                names.update(alias.asname or alias.name for alias in node.names
                             if f"{node.module}.{alias.name}" in HTTP_CLIENTS)
    return names


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def scan(root: Path = PACKAGE_ROOT, package: str = "v1") -> list[str]:
    """Every `module:function` under `root` that calls an HTTP client, sorted."""
    sites: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        clients = _client_names(tree)
        if not clients:
            continue
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any(isinstance(n, ast.Call) and _root_name(n.func) in clients for n in ast.walk(func)):
                sites.add(f"{module}:{func.name}")
    return sorted(sites)


def current(root: Path = PACKAGE_ROOT, package: str = "v1",
            entries: tuple[ManifestEntry, ...] = MANIFEST) -> EgressManifest:
    declared = {e.call_site for e in entries}
    untracked = tuple(site for site in scan(root, package) if site not in declared)
    text = "\n".join(f"{e.call_site}|{e.effect_table}|{e.pre_io_marker}" for e in entries)
    text += "\nuntracked:" + ",".join(untracked)
    return EgressManifest(entries=entries, untracked=untracked, digest=hashlib.sha256(text.encode()).digest())
