"""The routability checker of the scale-out path (issue 23, docs/scale-out.md "How routability is checked").

It reads one statement as PostgreSQL received it (Django's captured SQL with its parameters bound, or a statement
of a PL/pgSQL body) and says, against the placement data of `connector.placement`, whether Citus could send it to
one shard:

* every table it names must have a placement (an unknown table is a finding);
* every reference to a `distributed` table must be pinned to one distribution value: an equality (or a one-value
  IN) of its distribution column with a constant that is not under an OR, or an equality join of that column
  with an already-pinned table of the same co-location group; an INSERT pins itself when its column list carries
  the distribution column and every row carries the same value (VALUES rows or unnest arrays);
* a table that has no distribution column yet (`backfill` in the placement) is pinned the same way through its
  parent key: the statement names exactly one parent row, so on Citus it gains `AND account_id = %s` mechanically;
* all pinned constants of one statement must be the same value (two accounts = two shards);
* a row lock (FOR UPDATE/SHARE) is allowed only when every distributed table is pinned (single-shard; Citus runs
  SELECT .. FOR UPDATE in single-shard queries only); row locks on reference tables are reported as such;
* a hot-path function (`connector.placement.ROUTINES`) must be called with one constant account, and its body's
  statements are checked with the routine's account variables standing for that constant.

Why text and not EXPLAIN: the single-node plan says nothing about shards (every table is one relation here), and
the capture already holds the exact bound text; Django quotes every identifier, so table and column references
are recognised exactly, and the checker fails closed (anything it cannot pin is a finding). It is deliberately
strict: a constant equality is required, so a filter that only implies one account (`id = 5`) is a finding.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from connector.placement import DEFAULT, DISTRIBUTED, REFERENCE, ROUTINES, Placement

CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|SET|SHOW)\b", re.I)
ADVISORY = re.compile(r"pg_advisory_xact_lock(_shared)?\s*\(", re.I)
ROW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+UPDATE|KEY\s+SHARE|UPDATE|SHARE)\b", re.I)
KEYWORDS = {"where", "on", "set", "inner", "left", "right", "full", "cross", "join", "order", "group", "limit",
            "for", "values", "select", "returning", "using", "natural", "outer", "lateral", "as", "default",
            "union", "having", "offset", "window", "into", "with"}
IDENT = r'"?(\w+)"?'
NOT_KEYWORD = r"(?!(?:" + "|".join(sorted(KEYWORDS)) + r"|from)\b)"
REF = re.compile(r"\b(FROM|JOIN|UPDATE|INTO)\s+" + IDENT + r"(?:\s+(?:AS\s+)?" + NOT_KEYWORD + IDENT + r")?", re.I)
LITERAL = r"('(?:[^']|'')*'(?:::[\w ]+(?:\[\])?)*|-?\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class Finding:
    table: str
    problem: str  # "unpinned", "row lock not single-shard", "two distribution values", "no placement", ...

    def __str__(self) -> str:
        return f"{self.table}: {self.problem}"


@dataclass
class Verdict:
    sql: str
    findings: list[Finding]
    reference_locks: list[str]
    advisory: bool
    pinned_via_parent: list[str]

    @property
    def routable(self) -> bool:
        return not self.findings


def _enclosing_span(sql: str, pos: int) -> tuple[int, int]:
    depth, start = 0, 0
    for i in range(pos - 1, -1, -1):
        if sql[i] == ")":
            depth += 1
        elif sql[i] == "(":
            if depth == 0:
                start = i + 1
                break
            depth -= 1
    depth, end = 0, len(sql)
    for i in range(pos, len(sql)):
        if sql[i] == "(":
            depth += 1
        elif sql[i] == ")":
            if depth == 0:
                end = i
                break
            depth -= 1
    return start, end


def _under_or(sql: str, pos: int) -> bool:
    """True when the predicate at `pos` is (part of) a disjunct: some parenthesised group enclosing it, or the
    statement itself, has an OR at its own level, so it does not restrict the whole statement to one value. Fails
    closed: an OR elsewhere at an enclosing level (another clause, an outer query) counts too."""
    start, end = _enclosing_span(sql, pos)
    while True:
        depth = 0
        for m in re.finditer(r"[()]|\bOR\b", sql[start:end], re.I):
            tok = m.group(0)
            if tok == "(":
                depth += 1
            elif tok == ")":
                depth -= 1
            elif depth == 0:
                return True
        if start == 0:
            return False
        start, end = _enclosing_span(sql, start - 1)


def _strip_literals(sql: str) -> str:
    """The statement with string literals blanked (same length), so keywords inside data never match."""
    return re.sub(r"'(?:[^']|'')*'", lambda m: "'" + " " * (len(m.group(0)) - 2) + "'", sql)


def _col(ref: str, column: str) -> str:
    return r'(?<![\w"])"?' + re.escape(ref) + r'"?\."?' + re.escape(column) + r'"?(?![\w"])'


def _constant_equalities(sql: str, blank: str, ref: str, column: str) -> list[str]:
    """Constants the statement pins `ref.column` to (equality or one-value IN, not under an OR)."""
    values = []
    for pattern in (_col(ref, column) + r"\s*=\s*" + LITERAL, LITERAL + r"\s*=\s*" + _col(ref, column),
                    _col(ref, column) + r"\s+IN\s*\(\s*" + LITERAL + r"\s*\)"):
        for m in re.finditer(pattern, sql, re.I):
            if not _under_or(blank, m.start()):
                values.append(re.sub(r"::.*$", "", m.group(1)))
    return values


def _joined_to(sql: str, blank: str, ref: str, column: str) -> list[tuple[str, str]]:
    """(other ref, other column) pairs that `ref.column` is equated with, not under an OR."""
    out = []
    col = _col(ref, column)
    other = r'"?(\w+)"?\."?(\w+)"?'
    for pattern, swap in ((col + r"\s*=\s*" + other, False), (other + r"\s*=\s*" + col, True)):
        for m in re.finditer(pattern, sql, re.I):
            if not _under_or(blank, m.start()):
                out.append((m.group(1), m.group(2)))
    return out


def _insert_values(sql: str, table: str, column: str) -> list[str] | None:
    """The values an INSERT puts in `column` (None when it is not an INSERT into `table` carrying it)."""
    m = re.match(r'\s*INSERT\s+INTO\s+"?' + re.escape(table) + r'"?\s*\(([^)]*)\)\s*(.*)$', sql, re.I | re.S)
    if m is None:
        return None
    columns = [c.strip().strip('"') for c in m.group(1).split(",")]
    if column not in columns:
        return None
    index, rest = columns.index(column), m.group(2)
    if re.match(r"SELECT\s+\*\s+FROM\s+unnest\(", rest, re.I):  # bulk insert: one array per column
        arrays = re.findall(r"E?'(\{[^']*\})'", rest)
        if len(arrays) != len(columns):
            return []
        return [v.strip('"') for v in arrays[index].strip("{}").split(",")]
    scalar = re.match(r"SELECT\s+(?!\*)(.*?)(?:\s+FROM\s+unnest\((.*)\)\s+AS\s+u\(([^)]*)\))?"
                      r"(?:\s+ON\s+CONFLICT\b.*?)?(?:\s+RETURNING\b.*)?$", rest, re.I | re.S)
    if scalar:  # set-based insert with one-value columns bound once (D-263): SELECT $1::t, u.c1 FROM unnest(...)
        items = [i.strip() for i in _split_top(scalar.group(1))]
        if len(items) != len(columns):
            return []
        item = items[index]
        if re.fullmatch(r"(\$\d+|%s|'[^']*'|-?\d+)(::\w+)?", item):  # one value for every row of the statement
            return [re.sub(r"::\w+$", "", item).strip("'")]
        return []  # a per-row value from the unnested arrays: not provably one shard (fail closed)
    if re.match(r"VALUES\b", rest, re.I):
        rows = []
        body = re.split(r"\bRETURNING\b", rest[6:], flags=re.I)[0]
        for row in _top_level_groups(body):
            items = _split_top(row)
            if len(items) != len(columns):
                return []
            rows.append(items[index].strip())
        return rows
    return []


def _top_level_groups(text: str) -> list[str]:
    groups, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        if quoted:
            continue
        if ch == "(":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                groups.append(text[start:i])
    return groups


def _split_top(text: str) -> list[str]:
    items, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        if quoted:
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _refs(blank: str, tables: dict[str, Placement]) -> tuple[dict[str, str], list[str]]:
    """alias -> table for every table reference, and the names that look like tables but have no placement."""
    refs, unknown = {}, []
    for m in REF.finditer(blank):
        name, alias = m.group(2), m.group(3)
        if name.lower() in ROUTINES or name.lower() in {"unnest", "lateral"}:
            continue
        if name not in tables:
            if re.match(r"^(connector|effects|cutover|v1|observability|governance|django|auth|axes|rest)_",
                        name):
                unknown.append(name)
            continue
        if alias is None or alias.lower() in KEYWORDS:
            alias = name
        refs[alias] = name
    return refs, unknown


def check(sql: str, *, tables: dict[str, Placement] = DEFAULT) -> Verdict:
    blank = _strip_literals(sql)
    verdict = Verdict(sql, [], [], bool(ADVISORY.search(blank)), [])
    if CONTROL.match(sql):
        return verdict
    for name, routine in ROUTINES.items():
        for m in re.finditer(r"\b" + name + r"\s*\(", blank, re.I):
            first = _split_top(sql[m.end():_enclosing_span(sql, m.end())[1]])
            args = [a.strip() for a in first]
            # the account argument of both routines is a constant for a single-account call
            position = 1 if name == "connector_receipt_admit" else 0
            if not re.fullmatch(LITERAL, args[position] if len(args) > position else ""):
                verdict.findings.append(Finding(name, "routine called without one constant account"))
    refs, unknown = _refs(blank, tables)
    verdict.findings += [Finding(t, "no placement") for t in unknown]
    for table in tables:  # fail closed: a placed table named anywhere must have been read as a reference
        if table not in refs.values() and re.search(r'(?<![\w"])"?' + re.escape(table) + r'"?(?![\w"(])', blank):
            verdict.findings.append(Finding(table, "reference not recognised"))
    pinned: dict[str, set[str]] = {}
    parent_pinned: set[str] = set()

    def pin(alias: str) -> bool:
        table = refs[alias]
        p = tables[table]
        column, via = (p.column, None) if p.backfill is None else (p.backfill[0], p.backfill)
        values = _constant_equalities(sql, blank, alias, column)
        inserted = _insert_values(sql, table, column)
        if inserted:
            values += inserted
        for other, other_col in _joined_to(sql, blank, alias, column):
            if other in pinned and other in refs:
                op = tables[refs[other]]
                if via is None and op.group == p.group and other_col == (op.column if op.backfill is None
                                                                           else op.backfill[0]):
                    values += sorted(pinned[other])
                if via is not None and refs[other] == via[1] and other_col == "id":
                    values += sorted(pinned[other])
        if not values:
            return False
        pinned[alias] = set(values) if via is None else {f"parent:{v}" for v in values}
        if via is not None:
            parent_pinned.add(table)
        return True

    todo = sorted(a for a, t in refs.items() if tables[t].kind == DISTRIBUTED)
    changed = True
    while changed:
        changed = False
        for alias in [a for a in todo if a not in pinned]:
            if pin(alias):
                changed = True
    used_aliases = set(todo)
    for alias in todo:
        if alias not in pinned:
            verdict.findings.append(Finding(refs[alias], "unpinned"))
    account_values = {v for a, vs in pinned.items() if not next(iter(vs)).startswith("parent:") for v in vs}
    if len(account_values) > 1:
        verdict.findings.append(Finding(",".join(sorted({refs[a] for a in pinned})), "two distribution values"))
    verdict.pinned_via_parent = sorted(parent_pinned)
    if ROW_LOCK.search(blank):
        if any(alias not in pinned for alias in used_aliases):
            verdict.findings.append(Finding(",".join(sorted({refs[a] for a in used_aliases if a not in pinned})),
                                            "row lock not single-shard"))
        # `FOR UPDATE OF e` locks only the rows of the named aliases (or tables), not those of the joined tables
        lock_of = re.search(r"\bFOR\s+(?:NO\s+KEY\s+)?(?:UPDATE|SHARE)\s+OF\s+([\w\s,\"]+?)(?:\s+SKIP\b|\s+NOWAIT\b|;|$)",
                            blank, re.I)
        named = {n.strip().strip('"') for n in lock_of.group(1).split(",")} if lock_of else None
        locked = [t for a, t in refs.items() if named is None or a in named or t in named]
        verdict.reference_locks = sorted({t for t in locked if tables[t].kind == REFERENCE})
    return verdict


def body_statements(source: str, account_names: tuple[str, ...]) -> list[str]:
    """The SQL statements of a PL/pgSQL body, with the routine's account variables replaced by one constant (what
    they hold is the one account the call is for)."""
    text = re.sub(r"--[^\n]*", "", source)
    for name in account_names:
        text = re.sub(r"\b" + re.escape(name) + r"\b(?!\s*:=)", "424242", text)
    out = []
    for m in re.finditer(r"\b(SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM|PERFORM)\b", text, re.I):
        if m.group(1).upper() == "SELECT" and re.search(r"\b(INSERT\s+INTO|PERFORM)\s*$", text[:m.start()][-40:],
                                                        re.I):
            continue
        end = text.find(";", m.end())
        stmt = text[m.start():end]
        if m.group(1).upper() == "PERFORM":
            stmt = "SELECT " + stmt[len("PERFORM"):]
        out.append(" ".join(stmt.split()))
    return out
