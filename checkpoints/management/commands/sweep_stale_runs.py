"""``manage.py sweep_stale_runs``: the stale-run sweep, once (DESIGN.md section 4).

The same function Celery beat runs; idempotent and safe beside running workers.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from checkpoints import services


class Command(BaseCommand):
    help = "Move runs whose owner went quiet into 'ambiguous' (and their submitted effects " \
           "into 'unresolved'). Idempotent."

    def handle(self, *args, **options):
        stats = services.sweep_stale_runs()
        self.stdout.write(
            f"examined {stats['examined']} run(s); {stats['runs_ambiguous']} became ambiguous; "
            f"{stats['effects_unresolved']} effect(s) became unresolved; "
            f"{stats['reconcile_redriven']} reconcile request(s) sent again"
        )
