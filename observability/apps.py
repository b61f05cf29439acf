from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Health, metrics and the stage samples behind the overview's pictures. It owns no business fact: its one
    table holds readings of the other apps' backlogs, taken once a minute and kept for a day."""

    name = "observability"
    default_auto_field = "django.db.models.BigAutoField"
