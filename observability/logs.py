"""The logging filter that puts the hot path's ids on every record (issue 21): account_id, receipt_id,
execution_id, effect_id, trace_id, span_id, as far as the stage bound them (connector.logcontext). Installed on
the stderr handler by config/settings/logging.py, so the JSON formatter writes them as fields. A field the call
already passed through `extra` is left as it is."""
from __future__ import annotations

import logging

from connector import logcontext


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in logcontext.current().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
