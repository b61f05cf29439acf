"""Where every table lives on the scale-out path (issue 23, docs/scale-out.md, decisions D-240..D-243).

The path is PostgreSQL distributed by account with Citus: per-account tables are hash-distributed on `account_id`
and co-located (group `account`); the REST bulk delivery tables are distributed on their domain and co-located
with each other (group `delivery-domain`); owners and small service-wide facts are reference tables (a copy on
every node); operator and migration bookkeeping stays local to the coordinator; the journal database is a plain
PostgreSQL server of its own, never part of the cluster.

This module is data only (no imports from any app): `tests/scaleout/` checks it against the database and every hot
statement, and `scripts/scale_out_doc.py` generates the table section of docs/scale-out.md from it, so the
document and the test cannot drift.

A distributed table that has no `account_id` column today names `backfill` = (its foreign key, the parent table):
on Citus the column is added and filled from the parent (Citus's "needs backfill" class of table); until then its
hot statements must name exactly one parent row, which is what makes adding `AND account_id = %s` mechanical.
"""
from __future__ import annotations

from dataclasses import dataclass

DISTRIBUTED, REFERENCE, LOCAL, JOURNAL = "distributed", "reference", "coordinator-local", "journal"
KINDS = (DISTRIBUTED, REFERENCE, LOCAL, JOURNAL)
ACCOUNT, DOMAIN = "account", "delivery-domain"


@dataclass(frozen=True)
class Placement:
    kind: str
    why: str
    column: str = ""  # the distribution column on Citus (distributed tables only)
    group: str = ""  # the co-location group (distributed tables only)
    backfill: tuple[str, str] | None = None  # (foreign key column, parent table) when `column` must be added
    hot: bool = False  # touched by a hot transaction (docs/scale-out.md, "Hot transactions")


def _acct(why: str, *, hot: bool = True, via: tuple[str, str] | None = None) -> Placement:
    return Placement(DISTRIBUTED, why, "account_id", ACCOUNT, via, hot)


def _domain(why: str, *, via: tuple[str, str] | None = None) -> Placement:
    return Placement(DISTRIBUTED, why, "domain_id", DOMAIN, via, False)


def _ref(why: str, *, hot: bool = False) -> Placement:
    return Placement(REFERENCE, why, hot=hot)


def _local(why: str) -> Placement:
    return Placement(LOCAL, why)


def _journal(why: str) -> Placement:
    return Placement(JOURNAL, why)


_DJANGO = "Django/operator bookkeeping: small, never joined with account data by a hot statement"

#: Every table of the `default` database.
DEFAULT: dict[str, Placement] = {
    # -- Django, auth, admin, login throttling -----------------------------------------------------------------
    "django_migrations": _local("migration history of the coordinator's schema; Citus propagates DDL from there"),
    "django_content_type": _ref("referenced by auth permissions and admin log; identical on every node"),
    "django_session": _local(_DJANGO),
    "django_admin_log": _local(_DJANGO),
    "auth_user": _ref("operators; approval rows reference them by foreign key, so every node needs the rows"),
    "auth_group": _local(_DJANGO),
    "auth_group_permissions": _local(_DJANGO),
    "auth_permission": _local(_DJANGO),
    "auth_user_groups": _local(_DJANGO),
    "auth_user_user_permissions": _local(_DJANGO),
    "axes_accessattempt": _local("login throttling of the operator screens; web processes reach the coordinator"),
    "axes_accessattemptexpiration": _local("login throttling of the operator screens"),
    "axes_accessfailurelog": _local("login throttling of the operator screens"),
    "axes_accesslog": _local("login throttling of the operator screens"),
    # -- owners: immutable or rarely changed, read by every hot path, joined with account rows -----------------
    "connector_connectoraccount": _ref("the accounts themselves; admission resolves the exact key before it knows "
                                       "the account id, so the lookup must be local on every node", hot=True),
    "connector_packgeneration": _ref("immutable pack generations, read by every node's Runtime"),
    "connector_bindingdefinition": _ref("immutable binding definitions of a pack generation"),
    "connector_integrationbindingview": _ref("catalog view: owner fact shared by every account of a service"),
    "connector_catalogbinding": _ref("catalog bindings: owner facts shared by every account"),
    "connector_credentialgeneration": _ref("immutable credential generations (secret references only); read by "
                                           "permits and egress of one account, changed only by owner transitions",
                                           hot=True),
    "connector_serviceconfigurationgeneration": _ref("immutable configuration generations of a service"),
    "connector_serviceconfigurationaccount": _ref("the account set of a configuration generation (immutable)"),
    "connector_serviceconfigurationcredentialmapping": _ref("immutable credential mapping of a configuration"),
    "connector_servingepoch": _ref("one epoch serves every account of a service: every hot write locks it FOR "
                                   "SHARE (a reference-table row lock, see 'Row locks'); activation FOR UPDATE",
                                   hot=True),
    "connector_servingepochbindingproof": _ref("immutable proof rows of an epoch"),
    "connector_servingepochcredentialproof": _ref("immutable proof rows of an epoch"),
    "connector_dualapprovalrequest": _ref("operator approval requests (rare writes); a reference table because an "
                                          "account-scoped link resolution references its approval"),
    "connector_dualapproval": _local("operator approvals (rare, coordinator transactions)"),
    "connector_dualapprovalsetmember": _ref("the stored members of a set approval request (written with it, never "
                                            "changed); a reference table beside its request"),
    "connector_stepfailure": _local("isolation evidence of a failed step, written after the step's own "
                                    "transaction rolled back; keyed by entity type + id, never joined"),
    # -- the account's serving state and its hot rows ----------------------------------------------------------
    "connector_accountservinggate": _acct("the per-account serialization point; every hot write locks it FOR "
                                          "SHARE by account_id"),
    "connector_credentialgenerationdispatchgate": _acct(
        "per credential generation, which belongs to one account; locked FOR SHARE by permit and egress",
        via=("credential_generation_id", "connector_credentialgeneration")),
    "connector_v1acceptancetombstone": _acct("V1 keys of the account, checked at admission"),
    "connector_replayrequest": _acct("replays of one account's receipts"),
    "connector_v1predecessorref": _acct("a replay's V1 predecessor evidence, bound to the account's V1 tombstone "
                                        "(D-331)", hot=False,
                                        via=("tombstone_id", "connector_v1acceptancetombstone")),
    "connector_receipt": _acct("admission writes it with the account; materialization locks it"),
    "connector_receiptadmissionkey": _acct("the (account, channel, key) namespace of admission"),
    "connector_receiptcomponent": _acct("children of one receipt", via=("receipt_id", "connector_receipt")),
    "connector_materializationdue": _acct("the receipt's pending materialization",
                                          via=("receipt_id", "connector_receipt")),
    "connector_event": _acct("events of one account"),
    "connector_orderinglane": _acct("lanes of one account; advance locks one"),
    "connector_supersededdecision": _acct("lane decisions", via=("lane_id", "connector_orderinglane")),
    "connector_gapdecision": _acct("lane decisions", via=("lane_id", "connector_orderinglane")),
    "connector_laneresumption": _acct("lane decisions", via=("lane_id", "connector_orderinglane")),
    "connector_projectionwindow": _acct("windows of one account"),
    "connector_windowmember": _acct("members of one window", via=("window_id", "connector_projectionwindow")),
    "connector_projection": _acct("projections of one account"),
    "connector_execution": _acct("executions of one account; claimed with a fenced lease"),
    "connector_executionattempt": _acct("attempts of one execution", via=("execution_id", "connector_execution")),
    "connector_executiondependency": _acct("dependencies of one execution",
                                           via=("execution_id", "connector_execution")),
    "connector_crmrecord": _acct("the demo application's records of one account"),
    "connector_applicationresult": _acct("the Runtime's result of one command, written in the account's "
                                         "application transaction (keyed by command id today)",
                                         via=("command_id", "connector_execution")),
    "connector_auditrecord": _acct("written inside hot transactions (permit, settlement): it must live on the "
                                   "account's shard or every hot commit becomes a two-node commit; service-wide "
                                   "entries take account 0", via=("entity_id", "the audited row")),
    "connector_receipttrace": _acct("trace context of one receipt", via=("receipt_id", "connector_receipt")),
    "connector_projectiontrace": _acct("trace context of one projection",
                                       via=("projection_id", "connector_projection")),
    "connector_executiontrace": _acct("trace context of one execution", via=("execution_id", "connector_execution")),
    # -- outbound ----------------------------------------------------------------------------------------------
    "effects_processgeneration": _ref("dispatch holders (one row per worker process), locked FOR SHARE by permit "
                                      "and egress of every account", hot=True),
    "effects_outboundcommand": _acct("commands authored in the account's application transaction"),
    "effects_remoteeffect": _acct("effects of one account; claimed with a fenced lease"),
    "effects_remoteeffectattempt": _acct("attempts of one effect", via=("effect_id", "effects_remoteeffect")),
    "effects_dispatchpermit": _acct("permits of one effect; its gate is the account's gate",
                                    via=("effect_id", "effects_remoteeffect")),
    "effects_remotelink": _acct("remote identities owned by one account"),
    "effects_remotelinkresolution": _acct("operator resolutions of one effect's links", hot=False,
                                          via=("effect_id", "effects_remoteeffect")),
    "effects_destinationlimiter": _acct("per-account destination rate limiter"),
    "effects_remotecallintent": _acct("operator intents for a new remote call of one account's effect roots",
                                      hot=False),
    "effects_replayeffectcorrelation": _acct("a replay's correlation with its predecessor's effect roots", hot=False,
                                             via=("replay_request_id", "connector_replayrequest")),
    "effects_commandtrace": _acct("trace context of one command", via=("command_id", "effects_outboundcommand")),
    # -- REST bulk delivery: its own co-location group, by domain ----------------------------------------------
    "effects_deliveryapprovalreceipt": _ref("the delivery contract's approval receipt (one per contract digest)"),
    "effects_receiverbinding": _ref("receiver bindings: owner facts shared by every domain"),
    "effects_receiversecretversion": _ref("secret version references of a binding (never the secret)"),
    "effects_receivercertification": _local("operator certification of a receiver (rare)"),
    "effects_certificationapproval": _local("operator approvals of a certification (rare)"),
    "effects_deliveryprofile": _ref("immutable delivery profiles"),
    "effects_remotejobsemaphore": _ref("remote job capacity per principal: shared by every domain of the "
                                       "principal, changed only with a reference-table write"),
    "effects_mutationgate": _ref("the singleton mutation gate every delivery write checks"),
    "rest_delivery_effect_domain_lock": Placement(DISTRIBUTED, "the delivery domain itself, distributed on its "
                                                  "own id; its children on domain_id", "id", DOMAIN),
    "effects_deliveryparent": _domain("parent plans of one domain"),
    "effects_deliveryoperation": _domain("operations of one domain"),
    "effects_mayattemptmarker": _domain("MAY_ATTEMPT markers of one operation",
                                        via=("operation_id", "effects_deliveryoperation")),
    "effects_deliveryattempt": _domain("attempts of one operation", via=("operation_id", "effects_deliveryoperation")),
    "effects_deliveryobservation": _domain("observations of one operation",
                                           via=("operation_id", "effects_deliveryoperation")),
    "effects_deliverywatermark": _domain("range watermarks: the GiST exclusion (domain =, scope &&) includes the "
                                         "distribution column with equality, as Citus requires"),
    "effects_deliveryreconciliation": _domain("reconciliations of one operation",
                                              via=("operation_id", "effects_deliveryoperation")),
    "effects_reconciliationcampaign": _local("operator reconciliation campaigns (rare)"),
    # -- cutover and V1: coordinator operations ----------------------------------------------------------------
    "cutover_servingpublicationbarrierset": _ref("service-wide barrier set, first in the canonical lock order; "
                                                 "locked only by activation and cutover"),
    "cutover_barrierownerreceipt": _ref("one fenced receipt per owner of a barrier set (D-300), written with the "
                                        "set it belongs to"),
    "cutover_successiondrain": _ref("the drain of one successor attempt (rare writes); a reference table because "
                                    "the roots-closed insert trigger of receipts and outbound commands reads it on "
                                    "every node (D-315)"),
    "cutover_servicecutoverattempt": _ref("the cutover attempt (one per service, rare writes); a reference table "
                                          "because the per-account ordering baselines reference it"),
    "cutover_v1shutdowncertificate": _local("certificates of one cutover attempt"),
    "cutover_cutoverreadinesscertificate": _local("certificates of one cutover attempt"),
    "cutover_activationinventory": _local("the frozen activation inventory of one barrier set (D-320)"),
    "cutover_maintenancebarrierreceipt": _local("receipts of one cutover attempt"),
    "cutover_v1generationreceipt": _local("receipts of one cutover attempt"),
    "cutover_v1reconciliation": _local("reconciliation of one cutover attempt"),
    "cutover_v1tableremoval": _local("the record of the V1 tables' removal (one per service)"),
    "cutover_orderinghandoff": _acct("per-account ordering handoff, written next to the account's lanes",
                                     hot=False),
    "cutover_orderingbaseline": _acct("per-account ordering baseline of a cutover attempt", hot=False),
    "v1_v1processgeneration": _local("the legacy V1 authority, reached only through the cutover port"),
    "v1_v1barrier": _local("the legacy V1 authority"),
    "v1_v1sourcecursor": _local("the legacy V1 authority"),
    "v1_v1workitem": _local("the legacy V1 authority (keyed by account key, not id)"),
    "v1_v1outboundeffect": _local("the legacy V1 authority"),
    "v1_v1highwater": _local("the legacy V1 authority"),
    "observability_stagesample": _local("stage samples of the operator overview, written by the sampler"),
}

#: Every table of the `journal` database: a separate PostgreSQL server on the scale-out path too (it must outlive a
#: restore of the default database), never a Citus node.
JOURNAL_TABLES: dict[str, Placement] = {
    "django_migrations": _journal("migration history of the journal database"),
    "cutover_cutoverdecision": _journal("cutover decisions, outside the database a restore replaces"),
    "cutover_v1restorepoint": _journal("restore points"),
    "cutover_restorepointrehearsal": _journal("restore rehearsals"),
    "cutover_restoreattempt": _journal("restore attempts"),
    "effects_journalepochattestation": _journal("the delivery journal's epoch attestations"),
}


@dataclass(frozen=True)
class Routine:
    """A PL/pgSQL function of the hot path: its body's statements are routed by the account its arguments or
    variables name (the checker reads the body from pg_proc). `distribution_arg` is the argument
    `create_distributed_function` would take if the function were delegated (docs/scale-out.md, D-242)."""

    distribution_arg: str
    account_names: tuple[str, ...]  # argument and variable names that hold the account id inside the body
    why: str


ROUTINES: dict[str, Routine] = {
    "connector_receipt_admit": Routine(
        "p_account_hint", ("account_pk", "p_account_hint"),
        "one-statement admission: every statement after the account lookup is scoped to that account"),
    "connector_lock_serving": Routine(
        "p_account", ("p_account",), "the serving guard's locks: the gate by account, the epoch by id (reference)"),
}


def placement(table: str, *, database: str = "default") -> Placement:
    return (JOURNAL_TABLES if database == "journal" else DEFAULT)[table]


def distributed(group: str | None = None) -> dict[str, Placement]:
    return {t: p for t, p in DEFAULT.items() if p.kind == DISTRIBUTED and (group is None or p.group == group)}

#: Reference tables a hot statement row-locks (FOR SHARE): Citus serialises such a lock with writes of the reference
#: table by a lock on its shard (docs/scale-out.md, "What the path relies on"); the epoch's is taken inside
#: connector_lock_serving. The routability test asserts the captured statements lock no other reference table.
REFERENCE_ROW_LOCKS = frozenset({"effects_processgeneration"})

#: The hot transactions the routability test runs, in order (docs/scale-out.md, "Hot transactions").
HOT_STEPS = ("admission", "materialization", "lane advance", "claim", "run, completion, authoring", "batch claim",
             "batched egress")
#: Hot steps that run only in the single-node configuration (none: the egress step is one path in both).
SINGLE_NODE_STEPS: tuple[str, ...] = ()

#: Hot statements that Citus could not send to one shard, keyed by (step, table, problem), with what it takes. The
#: routability test fails on any other finding and on any entry here that no longer occurs. Issue 23's last slice
#: (D-244, D-245) emptied it of everything but the batched claim. One path per step (issue 39 item 1): the egress
#: step is one path for one effect or many (D-531) and the batched claim is the only claim of the worker (D-503, the
#: per-account claimer of D-264 removed), so their multi-effect and multi-account statements are here until those
#: statements name one account (the claim) or the permits, attempts and audit rows carry the account column
#: (issue 39 item 5).

#: The batched claim's statements, which serve several accounts in one statement by design (D-204/D-205, D-246),
#: and the batched egress step's, which name several effects' children: what the routability test's multi-account,
#: multi-effect run must yield exactly.
_BATCH = ("the batched claim serves any set of accounts in one statement (D-204/D-205: fairness across accounts in "
          "one round trip); it is the one claim path (D-503): on Citus it needs a rendering whose statements name "
          "one account each (the per-account claimer of D-264 was that second path)")
_EGRESS_BATCH = ("the batched egress step (D-345..D-350) writes and locks the permits, attempts and audit rows of "
                 "several effects of ONE account in one statement; those tables reach their shard through one parent "
                 "row each (`via`), so a statement naming several parents is not provably one shard until they carry "
                 "the account column. A batch of one (worker.effect_dispatch_once) names one parent each, but not "
                 "provably")
SINGLE_NODE_ONLY: dict[tuple[str, str, str], str] = {
    ("batch claim", "connector_execution", "unpinned"):
        "the fair candidate scan over accounts (recursive skip scan) is cross-shard by design, even for a claimer "
        "given its shard group (D-243). " + _BATCH,
    ("batch claim", "connector_execution,connector_executionattempt", "row lock not single-shard"):
        "the lease CAS locks candidates of the batch in one statement (locks.executions_lease). " + _BATCH,
    ("batch claim", "connector_executionattempt", "unpinned"):
        "the Attempts of the batch are inserted from the CAS. " + _BATCH,
    ("batch claim", "connector_lock_serving", "routine called without one constant account"):
        "the batch guards every account of the batch in one statement (guard.lock_serving_accounts). " + _BATCH,
    ("batched egress", "connector_auditrecord", "unpinned"): _EGRESS_BATCH,
    ("batched egress", "effects_dispatchpermit", "row lock not single-shard"): _EGRESS_BATCH,
    ("batched egress", "effects_dispatchpermit", "unpinned"): _EGRESS_BATCH,
    ("batched egress", "effects_remoteeffectattempt", "unpinned"): _EGRESS_BATCH,
}
KNOWN_UNROUTABLE: dict[tuple[str, str, str], str] = {  # an egress batch of one locks one permit: one shard
    key: reason for key, reason in SINGLE_NODE_ONLY.items()
    if key[0] == "batch claim" or key[2] != "row lock not single-shard"}
