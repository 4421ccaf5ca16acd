"""``manage.py notify_send``: one notification round (issue 21; docs/notifications.md):
the outbox dispatched into messages, then due messages sent, within a time budget.

The same function Celery beat (``checkpoints.tasks.notify``) and the in-process worker
run; safe beside them (claims skip what another sender holds). For a cron'd deployment
without a broker or in-process worker, and for tests that kill a sender mid-send.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from checkpoints.jobs.notify import notify_round


class Command(BaseCommand):
    help = "Dispatch the notification outbox and send due messages, once."

    def add_arguments(self, parser):
        parser.add_argument("--budget-s", type=float, default=None,
                            help="stop claiming new messages after this many seconds "
                                 "(default RECOVERY_NOTIFY_ROUND_BUDGET_S)")

    def handle(self, *args, **options):
        budget = options["budget_s"]
        if budget is not None and not 0 < budget <= 3600:
            raise CommandError("--budget-s: must be within 0..3600 seconds")
        sent = notify_round(budget)["send"]
        self.stdout.write(f"{sent['sent']} attempt(s): {sent['delivered']} delivered, "
                          f"{sent['retrying']} to retry, {sent['failed']} failed; "
                          f"{sent['disabled']} endpoint(s) disabled")
