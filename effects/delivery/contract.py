"""The REST bulk delivery contract (`docs/contracts/rest-bulk-delivery-design.v1.yaml`), loaded once and turned
into the running state machine and error catalog. Nothing here is a second, hand-typed copy: the legal tuples,
automatic and operator-only transitions with their CAS kinds and guards, terminal tuples, forbidden combinations,
failure scenarios and error catalog are read from the file.

Loading fails closed (`ContractInvalid`) on a duplicate mapping key anywhere in the YAML, on a document that does
not validate against `docs/schema/rest-bulk-delivery-design-contract-v1.schema.json`, and on a contract that
contradicts itself (a transition naming an undeclared tuple, a legal tuple matching a forbidden combination, a
failure scenario that is not a declared transition or does not preserve its acknowledgement, a stable error code
without catalog metadata).

The contract is immutable: its sha256 is pinned (`PINNED_DIGEST`); approval is a separate receipt
(`effects.models.DeliveryApprovalReceipt`) that references this digest and never edits the file.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_PATH = ROOT / "docs" / "contracts" / "rest-bulk-delivery-design.v1.yaml"
SCHEMA_PATH = ROOT / "docs" / "schema" / "rest-bulk-delivery-design-contract-v1.schema.json"
PINNED_DIGEST = "e61a649e1c13e3bb3df8536230775f3e9c859cc425c1cfc623aa89fbae8ad36c"
AXES = ("execution", "remote_effect", "acknowledgement", "verification", "checkpoint")


class ContractInvalid(ValueError):
    """The delivery contract file cannot be used: duplicate key, schema violation or self-contradiction."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ContractInvalid(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                                      f"(first at line {seen[key].start_mark.line + 1})")
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str | bytes) -> Any:
    """Parse YAML with duplicate mapping keys rejected."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ContractInvalid(f"not YAML: {exc}") from exc


@dataclass(frozen=True)
class Transition:
    source: str
    target: str
    cas: str
    guards: tuple[str, ...] = ()
    effects: tuple[str, ...] = ()
    operator_only: bool = False

    @property
    def proof(self) -> str | None:
        """What an operator-only resolution must carry: effect_proof, evidence_digest, verification_proof, or
        None (opening a reconciliation needs only the reconciliation ID and approval)."""
        for kind in ("effect_proof", "evidence_digest", "verification_proof"):
            if kind in self.cas:
                return kind
        return None


@dataclass(frozen=True)
class ErrorSpec:
    code: str
    exit_class: int
    retryability: str
    operator_action: str
    alert_severity: str
    evidence_schema: str


@dataclass(frozen=True)
class FailureScenario:
    name: str
    source: str
    target: str
    acknowledgement_preserved: str


@dataclass(frozen=True)
class Contract:
    raw: dict
    digest: str
    axes: dict[str, tuple[str, ...]]
    initial: str
    tuples: dict[str, tuple[str, str, str, str, str]]
    transitions: tuple[Transition, ...]
    terminal: frozenset[str]
    forbidden: tuple[tuple[str, ...], ...]
    monotonic_fields: tuple[str, ...]
    failure_scenarios: dict[str, FailureScenario]
    errors: dict[str, ErrorSpec]
    invariants: tuple[str, ...]
    unresolved_effect_states: frozenset[str] = field(default_factory=frozenset)

    # -- the state machine ------------------------------------------------------------------------------------

    def axis(self, tuple_name: str, axis: str) -> str:
        return self.tuples[tuple_name][AXES.index(axis)]

    def edges(self, *, operator_only: bool | None = None) -> set[tuple[str, str]]:
        return {(t.source, t.target) for t in self.transitions
                if operator_only is None or t.operator_only == operator_only}

    def transition(self, source: str, target: str) -> Transition | None:
        for t in self.transitions:
            if t.source == source and t.target == target:
                return t
        return None

    def sources_by_target(self, *, operator_only: bool) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for t in self.transitions:
            if t.operator_only == operator_only:
                out.setdefault(t.target, []).append(t.source)
        return {target: tuple(sources) for target, sources in out.items()}

    def is_unresolved(self, tuple_name: str) -> bool:
        """`mutation_policies.unresolved_effect_states` names values of several axes (SUBMITTING, ACCEPTED:
        execution; RUNNING: acknowledgement; UNDETERMINED, UNKNOWN, PARTIALLY_APPLIED: remote effect). A tuple is
        unresolved when any of its execution, remote-effect or acknowledgement values is one of them."""
        execution, effect, ack, _, _ = self.tuples[tuple_name]
        return bool({execution, effect, ack} & self.unresolved_effect_states)

    def tuples_where(self, **axes: Iterable[str] | str) -> list[str]:
        def match(values: tuple[str, ...]) -> bool:
            for axis, wanted in axes.items():
                allowed = {wanted} if isinstance(wanted, str) else set(wanted)
                if values[AXES.index(axis)] not in allowed:
                    return False
            return True
        return [name for name, values in self.tuples.items() if match(values)]

    def error(self, code: str) -> ErrorSpec:
        return self.errors[code]


def _transitions(raw: dict) -> tuple[Transition, ...]:
    machine = raw["state_machine"]
    out = []
    for operator_only, key in ((False, "automatic_transitions"), (True, "operator_only_transitions")):
        for item in machine[key]:
            out.append(Transition(source=item["from"], target=item["to"], cas=item["cas"],
                                  guards=tuple(item.get("guards", ())), effects=tuple(item.get("effects", ())),
                                  operator_only=operator_only))
    return tuple(out)


def _check(contract: Contract) -> None:
    problems: list[str] = []
    if contract.initial not in contract.tuples:
        problems.append(f"initial tuple {contract.initial!r} is not a legal tuple")
    for name, values in contract.tuples.items():
        for axis, value in zip(AXES, values, strict=True):
            if value not in contract.axes[axis]:
                problems.append(f"tuple {name}: {value!r} is not a value of axis {axis}")
        for combo in contract.forbidden:
            if tuple(values[:len(combo)]) == combo:
                problems.append(f"legal tuple {name} matches forbidden combination {list(combo)}")
    seen: set[tuple[str, str]] = set()
    for t in contract.transitions:
        for end in (t.source, t.target):
            if end not in contract.tuples:
                problems.append(f"transition {t.source} -> {t.target} names undeclared tuple {end!r}")
        if (t.source, t.target) in seen:
            problems.append(f"transition {t.source} -> {t.target} declared twice")
        seen.add((t.source, t.target))
        if t.source in contract.terminal and not t.operator_only:
            problems.append(f"automatic transition leaves terminal tuple {t.source}")
    for name in contract.terminal:
        if name not in contract.tuples:
            problems.append(f"terminal tuple {name!r} is not a legal tuple")
    for scenario in contract.failure_scenarios.values():
        if contract.transition(scenario.source, scenario.target) is None:
            problems.append(f"failure scenario {scenario.name} is not a declared transition")
        elif contract.axis(scenario.target, "acknowledgement") != scenario.acknowledgement_preserved:
            problems.append(f"failure scenario {scenario.name} does not preserve {scenario.acknowledgement_preserved}")
    stable = tuple(contract.raw["stable_error_codes"])
    if set(stable) != set(contract.errors) or len(stable) != len(set(stable)):
        problems.append("stable_error_codes and error_catalog differ")
    for code in contract.raw["mutation_policies"]["errors"].values():
        if code not in contract.errors:
            problems.append(f"mutation policy error {code} is not in the catalog")
    if problems:
        raise ContractInvalid("; ".join(problems))


def validate_schema(document: Any) -> None:
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(root)"
        raise ContractInvalid(f"schema violation at {where}: {first.message} ({len(errors)} in all)")


def parse(text: bytes) -> Contract:
    """Parse, schema-validate and self-check contract bytes."""
    raw = load_yaml(text)
    validate_schema(raw)
    machine = raw["state_machine"]
    contract = Contract(
        raw=raw,
        digest=hashlib.sha256(text).hexdigest(),
        axes={axis: tuple(values) for axis, values in machine["axes"].items()},
        initial=machine["initial_tuple"],
        tuples={name: tuple(values) for name, values in machine["legal_tuples"].items()},
        transitions=_transitions(raw),
        terminal=frozenset(machine["terminal_for_automatic_execution"]),
        forbidden=tuple(tuple(c) for c in machine["forbidden_combinations"]),
        monotonic_fields=tuple(machine["monotonic_fields"]),
        failure_scenarios={name: FailureScenario(name, s["from"], s["to"], s["acknowledgement_preserved"])
                           for name, s in raw["failure_scenarios"].items()},
        errors={code: ErrorSpec(code=code, **spec) for code, spec in raw["error_catalog"].items()},
        invariants=tuple(raw["invariants"]),
        unresolved_effect_states=frozenset(raw["mutation_policies"]["unresolved_effect_states"]),
    )
    _check(contract)
    return contract


@cache
def contract() -> Contract:
    """The shipped contract; refuses a file whose digest is not the pinned one (the contract is immutable)."""
    text = CONTRACT_PATH.read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    if digest != PINNED_DIGEST:
        raise ContractInvalid(f"{CONTRACT_PATH.name} has sha256 {digest}, not the pinned {PINNED_DIGEST}: the "
                              "researched contract is immutable; a change is a new contract version")
    return parse(text)
