"""``make bench`` (issue 8): the store's benchmarks, with their references, in one run.

``python -m bench`` (``bench/run.py``) creates its own PostgreSQL database, runs the write
scenarios (raw psycopg, the Django ORM, ``services.checkpoint_put``, HTTP through gunicorn,
LangGraph's ``PostgresSaver``), the read scenarios on data sets built by ``manage.py
generate_load`` and the web worker's memory, prints a table with the issue's targets and
writes ``var/bench/latest.json``. Benchmarks print numbers; nothing here is a test.

``bench/bench_login_starvation.py`` is a separate script (login starvation, issue 6).
"""
