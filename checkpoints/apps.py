from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    name = "checkpoints"
    verbose_name = "Checkpoints and recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, once the app registry is ready (Django's rule for ready()):
        # importing them registers their system checks.
        from .ops import (
            security,  # noqa: F401 (registers its deploy checks)
            staticcheck,  # noqa: F401 (registers recovery.E002)
        )
