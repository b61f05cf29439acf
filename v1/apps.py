from django.apps import AppConfig


class V1Config(AppConfig):
    name = "v1"
    verbose_name = "V1 (the pre-V2 execution model the service cuts over from)"
    default_auto_field = "django.db.models.BigAutoField"
