"""Heartbeats of background work (when it last finished, on the database clock)."""

from __future__ import annotations

from django.db import models


class Heartbeat(models.Model):
    """When background work last finished, on the database clock (issue 17, items 6 and
    11; ``checkpoints.heartbeat``): one row per ``name`` (``sweep``: any stale-run sweep;
    ``sweep.celery``, ``sweep.inprocess``, ``sweep.web``: a sweep run by a Celery worker,
    the embedded in-process worker or a web process catching up; ``job``: a reconcile
    job). System-wide, not a tenant's: it names no run, no tenant, no person."""

    name = models.CharField(max_length=32, primary_key=True)
    at = models.DateTimeField(help_text="database time the work last finished")

    def __str__(self) -> str:
        return f"{self.name} at {self.at}"
