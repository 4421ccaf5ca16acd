"""Project wiring for the recovery service; exposes the Celery app as ``celery_app``."""

from .celery import app as celery_app

__all__ = ["celery_app"]
