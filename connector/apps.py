from django.apps import AppConfig


class ConnectorConfig(AppConfig):
    name = "connector"
    verbose_name = "Connector (L0 kernel, owners, serving)"
    default_auto_field = "django.db.models.BigAutoField"
