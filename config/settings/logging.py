"""Structured JSON logs on stderr. Every record carries the hot path's ids bound by the stage it runs in
(account_id, receipt_id, execution_id, effect_id, trace_id, span_id: observability.logs.ContextFilter)."""
from config.env import env_str

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "ts", "levelname": "level", "name": "logger"},
        },
    },
    "filters": {"ids": {"()": "observability.logs.ContextFilter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["ids"]}},
    "root": {"handlers": ["stderr"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
    },
}
