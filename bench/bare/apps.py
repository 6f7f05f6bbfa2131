from django.apps import AppConfig


class BareConfig(AppConfig):
    name = "bench.bare"
    label = "bare"
    default_auto_field = "django.db.models.BigAutoField"
