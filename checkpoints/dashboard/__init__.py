"""The reviewer dashboard: server-rendered pages with htmx fragments (no SPA).

One function view per page or action, one module per page: ``inbox`` (the inbox, its
tabs, search and counts), ``run`` (the run page, its history pages and the audited
reveals), ``actions`` (the POST actions on a run), ``bulk`` (bulk actions and their
result page), ``reports`` (the report page; the figures are ``checkpoints.reports``),
``audit`` (the audit log page) and ``errors`` (``csrf_failure``). ``common`` holds the
decorators and helpers they share, ``forms`` the query-string and POST forms,
``context_processors`` what every page's template gets. ``checkpoints/urls.py`` maps the
URLs onto the views; the template tags stay in ``checkpoints/templatetags/`` (Django
looks for them there).

Each page view resolves the tenant from the URL through ``permissions.access_tenant``
(``common.tenant_page``: no role there -> 404, role lacks the right -> 403), reads
through ``selectors`` and writes only through ``services`` (which check the right again
and write the audit event in the same transaction). Fragments are ``{% partialdef %}``
blocks of the page template, rendered as ``"page.html#name"`` when the request comes
from htmx; every link and form also works without JavaScript.

Errors: a ``DomainError`` becomes its own status with a readable message. For htmx the
message fragment is retargeted into the error slot of the form that sent the request
(``#<form id>-error``), otherwise a full error page is rendered. ``templates/base.html``
tells htmx 2 to swap 400/403/404/409/412/422 responses (it swaps only 2xx by default).
One refusal is not an error page: reconcile while the run's owner is live (``OwnerLive``)
answers 409 with the run page itself, the reason shown where the button was.

Caching: every dashboard response carries ``Vary: HX-Request`` (``vary_on_htmx``; the
405s of ``require_safe``/``require_POST`` and CSRF failures too), since the same URL
answers a whole page or a fragment (or an error page or an error fragment) depending on
that header; every answer is ``no-store`` (``security.PrivateNoStoreMiddleware``). An htmx
history restore gets the whole page (``whole_page_for_history``), so every answer of a
view under ``@dashboard`` also carries ``Vary: HX-History-Restore-Request``.

Pages that stay true (issue 9): a CSRF failure (``errors.csrf_failure``) or an ended
session (``htmx_login_redirect``) inside an htmx action is a short message in place; an
action refused because someone acted first (``AlreadyDone``) answers the refreshed run
body with a sentence naming who and when (``actions.refreshes_when_acted_first``).

GETs never write: pages read through ``selectors`` (and the read-only
``services.retry_preview``); only the POST actions call services that write.
"""
