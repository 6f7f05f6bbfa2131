from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "portal.live"
    label = "live"
    verbose_name = "Live updates"

    def ready(self) -> None:
        from portal.live import signals  # noqa: F401  (connects the receivers)
