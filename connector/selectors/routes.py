"""Exact route and mapping resolution through the frozen epoch only (CV2-02-026): the epoch's binding proofs
name the exact pack generation and definition; the definition is read through its owner reader. No fallback to
a current pack, route name or mutable mapping. Compiled programs are cached by exact identity (epoch digest),
which is safe because every input is immutable."""
from __future__ import annotations

from functools import lru_cache

from django.db.backends.signals import connection_created

from connector.choices import BindingKind
from connector.errors import ConnectorError
from connector.interpreters import ordering_proof
from connector.interpreters.inbound import RouteProgram, compile_route
from connector.models import ServiceConfigurationAccount, ServingEpoch, ServingEpochBindingProof
from connector.selectors.owners import binding_definition_read


class ChannelNotFound(ConnectorError):
    """The account's active epoch has no enabled inbound route with that channel name."""

    code = "CHANNEL_NOT_FOUND"
    http_status = 404
    operator_action = "Use a channel enabled for the account in its active configuration generation."


def _definition(epoch_pk: int, kind: str, business_key: str):
    proof = (ServingEpochBindingProof.objects.select_related("binding", "pack_generation")
             .filter(epoch_id=epoch_pk, binding__kind=kind, binding__business_key=business_key).first())
    if proof is None:
        return None
    b = proof.binding
    return b, binding_definition_read(kind=kind, pack_generation_id=proof.pack_generation.generation_id,
                                      pack_payload_digest=bytes(b.pack_payload_digest), business_key=b.business_key,
                                      definition_version=b.definition_version)


# The compiled program of a route depends on the epoch and the channel only (the epoch's binding proof names the
# exact definition), so one entry serves every account of the epoch; which routes an account enables is the only
# per-account fact, read once per account and epoch. Keyed per account, the compiled program was rebuilt (pack
# payload read and verified, definition reread and compiled) for every account beyond the cache's 1,024th: a
# cost that grew with the number of accounts sending (D-252).
@lru_cache(maxsize=1 << 16)
def _enabled(epoch_digest: bytes, epoch_pk: int, account_id: int) -> frozenset[str]:
    enabled = (ServiceConfigurationAccount.objects.filter(generation__epochs__pk=epoch_pk, account_id=account_id)
               .values_list("enabled_routes", flat=True).first())
    return frozenset(enabled or ())


@lru_cache(maxsize=1024)
def _program(epoch_digest: bytes, epoch_pk: int, channel: str) -> RouteProgram | None:
    found = _definition(epoch_pk, BindingKind.INBOUND_ROUTE.value, channel)
    if found is None:
        return None
    binding, proof = found
    return compile_route(business_key=binding.business_key, version=binding.definition_version,
                         definition_bytes=proof.definition, definition_digest=proof.canonical_definition_digest,
                         pack_generation_id=proof.pack_generation_id)


def _route(epoch_digest: bytes, epoch_pk: int, account_id: int, channel: str) -> RouteProgram | None:
    if channel not in _enabled(epoch_digest, epoch_pk, account_id):
        return None
    return _program(epoch_digest, epoch_pk, channel)


def route_for(*, epoch_pk: int, epoch_digest: bytes, account_id: int, channel: str) -> RouteProgram:
    program = _route(bytes(epoch_digest), epoch_pk, account_id, channel)
    if program is None:
        raise ChannelNotFound(f"channel {channel!r} is not an enabled inbound route of this account's epoch")
    return program


def route_ordering_proof(*, epoch_pk: int, epoch_digest: bytes, channel: str) -> tuple[str, bytes | None] | None:
    """(ordering contract, conformance proof digest) of one inbound route of the epoch, enabled or not; None when
    the epoch binds no such route. An `order_independent` route's proof is checked again here, never taken from a
    record (OrderIndependenceUnproven, D-310); an ordered route has no such proof (None)."""
    program = _program(bytes(epoch_digest), epoch_pk, channel)
    if program is None:
        return None
    if program.contract != "order_independent":
        return program.contract, None
    digest = ordering_proof.check_order_independence(program.definition)
    if program.mapping_key:
        mapped = _mapping(bytes(epoch_digest), epoch_pk, program.mapping_key)
        ordering_proof.check_mapping_coverage(channel, program.definition, None if mapped is None else {
            "fields": [{"source": source, "target": target} for source, target in mapped]})
    return program.contract, digest


def epoch_ordering_proofs(*, epoch_pk: int, epoch_digest: bytes) -> dict[str, tuple[str, bytes | None]]:
    """`route_ordering_proof` of every inbound route the epoch binds: {channel: (contract, proof digest)}. Raises
    OrderIndependenceUnproven for the first `order_independent` route whose proof does not check."""
    channels = (ServingEpochBindingProof.objects.filter(epoch_id=epoch_pk, binding__kind=BindingKind.INBOUND_ROUTE)
                .values_list("binding__business_key", flat=True))
    return {c: route_ordering_proof(epoch_pk=epoch_pk, epoch_digest=epoch_digest, channel=c) for c in sorted(channels)}


def routes_for_accounts(*, epoch_pk: int, epoch_digest: bytes, account_ids: list[int],
                        channel: str) -> dict[int, RouteProgram | ChannelNotFound]:
    """`route_for` of one epoch and channel for several accounts, their enabled routes read in one query (not
    through the per-account cache): {account id: the program, or the ChannelNotFound `route_for` would raise}.
    Whole-service coordinators (the set-based handoffs, D-282) read a chunk of accounts this way."""
    enabled = dict(ServiceConfigurationAccount.objects
                   .filter(generation__epochs__pk=epoch_pk, account_id__in=account_ids)
                   .values_list("account_id", "enabled_routes"))
    program = _program(bytes(epoch_digest), epoch_pk, channel)
    refused = ChannelNotFound(f"channel {channel!r} is not an enabled inbound route of this account's epoch")
    return {a: program if program is not None and channel in (enabled.get(a) or ()) else refused
            for a in account_ids}


@lru_cache(maxsize=1024)
def _mapping(epoch_digest: bytes, epoch_pk: int, business_key: str) -> tuple[tuple[str, str], ...] | None:
    import json

    found = _definition(epoch_pk, BindingKind.FIELD_MAPPING.value, business_key)
    if found is None:
        return None
    fields = json.loads(found[1].definition)["fields"]
    return tuple((f["source"], f["target"]) for f in fields)


def mapping_for(*, epoch_pk: int, epoch_digest: bytes, business_key: str) -> tuple[tuple[str, str], ...] | None:
    return _mapping(bytes(epoch_digest), epoch_pk, business_key)


@lru_cache(maxsize=1024)
def _profile(epoch_digest: bytes, epoch_pk: int) -> str:
    return ServingEpoch.objects.filter(pk=epoch_pk, digest=epoch_digest).values_list("profile_id", flat=True).get()


def epoch_profile(*, epoch_pk: int, epoch_digest: bytes) -> str:
    """The digest profile of the exact epoch (pk and digest), read once per process: an epoch's columns other than
    its state never change (D-220), so the hot writers need not join the epoch to their row locks."""
    return _profile(bytes(epoch_digest), epoch_pk)


def clear_caches(**_signal) -> None:
    """Forget the compiled routes and mappings. Runs whenever this process opens a database session: a restore of
    the database terminates every application session and may bring back primary keys seen before (D-220)."""
    _enabled.cache_clear()
    _program.cache_clear()
    _mapping.cache_clear()
    _profile.cache_clear()


connection_created.connect(clear_caches, weak=False, dispatch_uid="connector.selectors.routes.clear_caches")
