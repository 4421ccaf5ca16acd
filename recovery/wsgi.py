"""WSGI entry point (``gunicorn recovery.wsgi``).

The Django application is wrapped in ``checkpoints.ops.keepalive.DrainBodyMiddleware``: a
body the application did not read is drained (or the connection closed after the
answer) so that a kept-alive connection serves the next request (issue 17, item 3)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")

from checkpoints.ops.keepalive import DrainBodyMiddleware  # noqa: E402 - after the settings

application = DrainBodyMiddleware(get_wsgi_application())
