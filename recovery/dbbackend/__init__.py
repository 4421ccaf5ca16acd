"""The project's database backends: Django's (or django-prometheus's) with one change
each, documented in its module."""
