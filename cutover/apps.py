from django.apps import AppConfig


class CutoverConfig(AppConfig):
    name = "cutover"
    verbose_name = "Cutover (V1 drain, certificates, restore points, activation)"
    default_auto_field = "django.db.models.BigAutoField"
