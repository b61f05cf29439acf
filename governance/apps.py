from django.apps import AppConfig
from django.db.models.signals import post_migrate

from governance.words import GLOSSARY, parse


class GovernanceConfig(AppConfig):
    name = "governance"
    verbose_name = "Operator governance"

    def ready(self) -> None:
        # ready(): roles reads the models, which Django loads only after every apps.py (app loading)
        from governance.roles import sync_roles_after_migrate

        post_migrate.connect(sync_roles_after_migrate, sender=self)
        parse(GLOSSARY.read_text(encoding="utf-8"))  # a malformed glossary fails at startup, not on a page (D-483)
