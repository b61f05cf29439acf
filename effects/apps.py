from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "effects"
    verbose_name = "Effects (outbound commands, remote effects, permits, delivery)"
    default_auto_field = "django.db.models.BigAutoField"
