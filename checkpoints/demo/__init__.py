"""The demo: a payment service, runtime workers that use only ``recovery_client.client``, and
the orchestration behind ``python manage.py demo``.

``payments`` and ``worker`` import nothing from Django, so they start fast in their own
processes and prove the client works for any runtime that vendors it.
"""
