"""Sends the cutover journal models to the `journal` database, and nothing else there."""
from __future__ import annotations

JOURNAL_DB = "journal"


def _is_journal(model) -> bool:
    return bool(getattr(model, "journal_database", False))


class JournalRouter:
    def db_for_read(self, model, **hints):
        return JOURNAL_DB if _is_journal(model) else "default"

    def db_for_write(self, model, **hints):
        return JOURNAL_DB if _is_journal(model) else "default"

    def allow_relation(self, obj1, obj2, **hints):
        return _is_journal(type(obj1)) == _is_journal(type(obj2))

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if model_name is None:
            # RunSQL/RunPython without a model: default only unless the operation says otherwise.
            return hints.get("target_db", "default") == db
        from django.apps import apps

        model = apps.get_model(app_label, model_name)
        return (db == JOURNAL_DB) == _is_journal(model)
