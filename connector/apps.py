from django.apps import AppConfig
from django.db.models.signals import post_migrate

from connector import dbroles


class ConnectorConfig(AppConfig):
    name = "connector"
    verbose_name = "Connector (L0 kernel, owners, serving)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # ready(): identity reads the models, which Django loads only after every apps.py (app loading)
        from connector import identity

        # After every migrate (all apps' tables exist by then): the application role's grants (issue 17).
        post_migrate.connect(dbroles.grant_after_migrate, sender=self, dispatch_uid="connector.dbroles.grants")
        # Every identity change, by any path, lands in the append-only audit trail (D-180).
        identity.connect()
