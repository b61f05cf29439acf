"""Celery: Redis only wakes workers; every worker re-reads and claims from PostgreSQL."""
from config.env import env_int, env_str

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
# Several deployments (or test runs) sharing one Redis database: every key the product writes there (Celery's queues,
# bindings and unacknowledged messages through kombu's `global_keyprefix`, and the materialization wake-up
# debounce keys of connector/tasks.py) begins with this prefix, so neither sees the other's (D-451). Empty: none.
CONNECTOR_REDIS_KEY_PREFIX = env_str("CONNECTOR_REDIS_KEY_PREFIX", "")
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": CONNECTOR_REDIS_KEY_PREFIX} if CONNECTOR_REDIS_KEY_PREFIX else {}
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "sweeper"
# One queue per stage, each consumed by its own worker processes (scripts/run.py worker_pools, D-173): a burst of
# materializations never waits in front of the executions it produces, nor executions in front of egress. The
# execution stage's workers consume `claims` and `lanes` in turn (the broker cycles between non-empty queues), so
# an execution wake-up never waits behind a backlog of lane advances either.
CELERY_TASK_ROUTES = {
    "connector.tasks.execution_claim_and_run": {"queue": "claims"},
    "connector.tasks.lane_advance": {"queue": "lanes"},
    "connector.tasks.receipt_materialize": {"queue": "materialize"},
    "connector.tasks.materialize_due": {"queue": "materialize"},
    "connector.tasks.*": {"queue": "sweeper"},
    "effects.tasks.effect_dispatch": {"queue": "egress"},
    "effects.tasks.delivery_step": {"queue": "delivery"},
    "effects.tasks.*": {"queue": "sweeper"},
    "v1.tasks.*": {"queue": "v1"},
    "observability.tasks.*": {"queue": "sweeper"},
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A broker outage of any length (issue 37 item 5, D-411): a worker keeps reconnecting instead of exiting after
# Celery's default 100 attempts. A task running when the connection drops finishes its PostgreSQL work (leases and
# fences, not the broker message, own the work); its late ack is lost, so the restored or re-delivered wake-up
# finds nothing left to claim. Cancelling such tasks (terminating their pool processes) would only make uncertain
# effects out of sends in flight. Where kombu itself crashes while restoring unacknowledged messages on the lost
# connection (AttributeError in the Redis transport, a known class of bugs), scripts/run.py restarts the worker.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Celery's Django fixup closes every database connection before and after each task unless this is set (celery 5.7,
# celery/fixups/django.py). Set, the fixup closes them only every 2 x this many task boundaries, and
# config/celery.py applies Django's own rule at each boundary instead (close_old_connections: CONN_MAX_AGE, a
# connection left broken by an error, the health check on next use), as a web request does (D-198).
CELERY_DB_REUSE_MAX = 1_000_000
# A sweep message expires when its successor is due: a sweep that could not start in time (the sweeper busy with a
# long sweep during a burst) is dropped instead of piling up behind it, since the next one finds the same work.
CELERY_BEAT_SCHEDULE = {
    "sweeper-serving-epochs": {
        "task": "connector.tasks.serving_epoch_sweep",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
    # The first planner statistics of a table, before autovacuum's first round (issue 40 goal 3, D-542).
    "sweeper-statistics": {
        "task": "connector.tasks.statistics_sweep",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    "sweeper-inbound": {
        "task": "connector.tasks.inbound_sweep",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    "sweeper-effects": {
        "task": "effects.tasks.effects_sweep",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    # Uncertain effects under a frozen idempotency contract (issue 37 item 2, D-430): their own beat, so the
    # effects sweep's report and cadence stay as they are.
    "sweeper-uncertain": {
        "task": "effects.tasks.uncertain_sweep",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
    "observability-stage-sample": {
        "task": "observability.tasks.stage_sample",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    "sweeper-delivery": {
        "task": "effects.tasks.delivery_sweep",
        "schedule": 5.0,
        "options": {"expires": 5.0},
    },
}
# Publishing only wakes workers; when the broker is down, fail fast and let the sweepers find the work in
# PostgreSQL instead of holding a request or a transaction's on-commit hook.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
CELERY_BROKER_CONNECTION_TIMEOUT = 2

# Worker liveness (issue 21, docs/operations.md): each worker touches this file when it is ready and on every
# Celery heartbeat of its consumer loop (2 s); `manage.py worker_alive --max-age S` exits 1 when it is older.
# One file per worker: give each its own path (e.g. per container, or suffix it with the node name).
CONNECTOR_WORKER_HEARTBEAT_FILE = env_str("CONNECTOR_WORKER_HEARTBEAT_FILE", "/tmp/connector-worker.heartbeat")

# A worker's own Prometheus scrape (issue 21, D-231, docs/operations.md): the worker's main process serves the
# metrics counted in process memory (with PROMETHEUS_MULTIPROC_DIR: the sum of every process writing that
# directory, its forked children included) on this port from `worker_ready`. 0 (the default) serves nothing.
# Loopback unless CONNECTOR_WORKER_METRICS_ADDR says otherwise (e.g. 0.0.0.0 in a container scraped from outside).
CONNECTOR_WORKER_METRICS_PORT = env_int("CONNECTOR_WORKER_METRICS_PORT", 0)
CONNECTOR_WORKER_METRICS_ADDR = env_str("CONNECTOR_WORKER_METRICS_ADDR", "127.0.0.1")
