"""The product's own knobs, read through connector.conf.connector_settings() (never at import time)."""
from config.env import BASE_DIR, env_int, env_str

CONNECTOR = {
    "SECRET_BACKEND_DIR": env_str("CONNECTOR_SECRET_DIR", str(BASE_DIR / ".data" / "secrets")),
    "GUARD_RETRY_LIMIT": env_int("CONNECTOR_GUARD_RETRY_LIMIT", 1),
    # The declared maximum account cardinality of one whole-service activation (first or successor, D-210): a larger
    # account set is refused with ACTIVATION_CARDINALITY_EXCEEDED before any barrier closes. The bench measured
    # 100,000 (docs/benchmarks.md, "Whole-service activation at scale").
    "ACTIVATION_MAX_ACCOUNTS": env_int("CONNECTOR_ACTIVATION_MAX_ACCOUNTS", 100_000),
    # Accounts one transaction of the whole-service halt and of the successor's handoffs covers (issue 19,
    # D-281/D-282): each halted gate holds its fair advisory lock until the chunk commits, and PostgreSQL's shared
    # lock table holds ~12,800 of them (D-209), so the chunk stays far below that.
    "HALT_CHUNK_ACCOUNTS": env_int("CONNECTOR_HALT_CHUNK_ACCOUNTS", 256),
    "SIGNATURE_TOLERANCE_SECONDS": env_int("CONNECTOR_SIGNATURE_TOLERANCE_SECONDS", 300),
    "LEASE_SECONDS": env_int("CONNECTOR_LEASE_SECONDS", 60),
    # Executions one worker step claims in one transaction (D-204); the lease above must cover running them all.
    "CLAIM_BATCH": env_int("CONNECTOR_CLAIM_BATCH", 10),
    # The batch materializer (issue 18, D-269): receipts read per batch (an account's materialized in one
    # transaction, D-521), reads per run before handing over to a fresh wake-up, the admission's wake-up debounce
    # (seconds a pending wake covers an account's new receipts), and how long a receipt may stay due before the
    # sweep materializes it itself although it could wake, when no run of its account is alive (D-270).
    "MATERIALIZE_BATCH": env_int("CONNECTOR_MATERIALIZE_BATCH", 50),
    # Runs of one account that materialize in parallel, each on its share of the receipts (pk modulo this): as
    # many as the materialize queue's worker processes (scripts/run.py: max(2, cpus)).
    "MATERIALIZE_SLOTS": env_int("CONNECTOR_MATERIALIZE_SLOTS", 2),
    "MATERIALIZE_ROUNDS": env_int("CONNECTOR_MATERIALIZE_ROUNDS", 20),
    "MATERIALIZE_WAKE_TTL": env_int("CONNECTOR_MATERIALIZE_WAKE_TTL", 10),
    "MATERIALIZE_STUCK_SECONDS": env_int("CONNECTOR_MATERIALIZE_STUCK_SECONDS", 60),
    # The demo CRM of make run, wherever DEMO_RECEIVER_PORT moved it, unless a base URL is given.
    "EGRESS_BASE_URL": env_str("CONNECTOR_EGRESS_BASE_URL",
                               f"http://127.0.0.1:{env_str('DEMO_RECEIVER_PORT', '8900')}"),
    "EGRESS_TIMEOUT_SECONDS": env_int("CONNECTOR_EGRESS_TIMEOUT_SECONDS", 5),
    # The effects sweep isolates worker generations that died on its host (effects/services/liveness.py).
    "HOLDER_LIVENESS": env_int("CONNECTOR_HOLDER_LIVENESS", 1),
    # A settlement PostgreSQL cannot take is tried again with backoff (issue 37 item 3, D-424); after this long the
    # egress process gives its holder generation up instead (D-425).
    "SETTLE_RETRY_FIRST_SECONDS": float(env_str("CONNECTOR_SETTLE_RETRY_FIRST_SECONDS", "0.25")),
    "SETTLE_RETRY_MAX_SECONDS": float(env_str("CONNECTOR_SETTLE_RETRY_MAX_SECONDS", "5")),
    "SETTLE_GIVE_UP_SECONDS": env_int("CONNECTOR_SETTLE_GIVE_UP_SECONDS", 60),
    # Effects per egress worker step (issue 20, D-350, D-531), at least 1: up to this many `prepared` effects of one
    # account whose destinations declare no limit are claimed, marked `sending` and settled in one transaction each;
    # the lease (LEASE_SECONDS) covers the batch's sequential exchanges. Only a size: one effect is a batch of one.
    "EGRESS_BATCH": env_int("CONNECTOR_EGRESS_BATCH", 10),
    # Distinct destination (callout) label values one process gives its egress, latency and deferral metrics before
    # counting the rest as `_other` (issue 21, D-232): the label set stays bounded whatever the contracts declare.
    "METRICS_MAX_DESTINATIONS": env_int("CONNECTOR_METRICS_MAX_DESTINATIONS", 100),
    # Identity governance (D-180): within this many hours after a person created, granted a role or permission to,
    # (re)activated or set the password of an account, that person and the account are not independent approvers.
    "IDENTITY_COOLING_HOURS": env_int("CONNECTOR_IDENTITY_COOLING_HOURS", 168),
    # How long an item may wait in each stage before the overview lists it as stuck work (seconds, issue 21;
    # docs/operations.md gives the reasoning and the alerts built on the same figures).
    "STAGE_BUDGETS_SECONDS": {
        "materialization_due": env_int("CONNECTOR_BUDGET_MATERIALIZATION_SECONDS", 60),
        "lane_pending": env_int("CONNECTOR_BUDGET_LANE_PENDING_SECONDS", 120),
        "execution_ready": env_int("CONNECTOR_BUDGET_EXECUTION_READY_SECONDS", 120),
        "execution_lease_expired": env_int("CONNECTOR_BUDGET_LEASE_EXPIRED_SECONDS", 60),
        "effect_prepared": env_int("CONNECTOR_BUDGET_EFFECT_PREPARED_SECONDS", 120),
        "effect_retry_due": env_int("CONNECTOR_BUDGET_EFFECT_RETRY_DUE_SECONDS", 60),
        "effect_dispatching": env_int("CONNECTOR_BUDGET_EFFECT_DISPATCHING_SECONDS", 300),
        "permit_granted": env_int("CONNECTOR_BUDGET_PERMIT_GRANTED_SECONDS", 60),
        "permit_sending": env_int("CONNECTOR_BUDGET_PERMIT_SENDING_SECONDS", 120),
    },
}

# The V1 deployment the cutover coordinator drives, through cutover.ports.V1OwnerPort (the `v1` app).
CUTOVER_V1_OWNER = env_str("CUTOVER_V1_OWNER", "v1.owner.V1Owner")
# Where V1RestorePoint dumps are written (pg_dump -Fc), one directory per cutover attempt; PG_BINDIR names the
# PostgreSQL client binaries when they are not on PATH.
CUTOVER_RESTORE_POINT_DIR = env_str("CUTOVER_RESTORE_POINT_DIR", str(BASE_DIR / ".data" / "restore-points"))
PG_BINDIR = env_str("PG_BINDIR", "")
