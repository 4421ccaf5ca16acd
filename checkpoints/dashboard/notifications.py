"""The Notifications page (issue 21, items 1 and 5; docs/notifications.md): the tenant's
notification endpoints for every role, and for its admin the forms that create, change,
enable or disable, rotate the secret of, delete and test them; an endpoint's page with
its delivery log (the newest ``selectors.notifications.DELIVERIES_MAX`` messages, every
attempt) and "resend" per message.

What a page shows is what the API shows (``api.serializers.notifications``): the rows
come from the same selectors, which dress each endpoint for the caller (``is_admin``,
``secret_hint``), and ``_shown`` gives a non-admin only what the API gives: the
``destination`` (a URL's scheme and host, an address's domain), never the URL, the
address or a secret's hint. A signing secret is in exactly one answer, the page the
create or the rotation renders (never a redirect's URL, never the session).

Every form posts to a view that turns the form into the API's body and calls the
service (``services.notify_endpoints``): the service is the one rule. Its error names a
field (``"url: …"``); the view renders the form again with the error beside that field
and the values typed, with the error's status (400, 422), nothing written.
"""

from __future__ import annotations

import re
import uuid

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import roles, selectors, services
from ..exceptions import DomainError
from ..jsonparse import JSON_WHITESPACE
from ..models import Tenant
from ..models.notifications import GROUP_WINDOW_S_DEFAULT, NotificationMessage
from ..selectors.notifications import DELIVERIES_MAX
from ..vocab import DeliveryState, NotificationChannel, NotificationEventType
from .common import (
    _base_context,
    _require_valid,
    dashboard,
    form_refusal,
    require_POST,
    require_safe,
    see_other,
    tenant_page,
)
from .forms import NoQuery
from .typed import typed_number

#: The fields of the create and edit forms, in the order the errors are looked for.
FORM_FIELDS = ("name", "channel", "url", "email", "event_types", "kinds", "agents",
               "services", "group_window_s", "quiet_period_s", "enabled")
#: Where a service's refusal is shown: the field its message names (``form_refusal``).
REFUSAL_FIELDS = {f: f for f in (*FORM_FIELDS, "confirm")}
#: A filter textarea's line breaks (what a browser sends: CR LF). The values are one a line,
#: as ``_values`` shows them: a comma or a space belongs to the value (an agent may be
#: called ``refund, assistant``), so the form sends what it shows and the service judges.
_LINES = re.compile(r"\r\n|\r|\n")
#: A grouped message's runs linked on the delivery log (the count is always whole).
RUNS_LINKED = NotificationMessage.RUNS_LISTED


#: The session key of the create and rotate forms already answered (``form_token`` ->
#: the endpoint's id; the newest ``FORM_TOKENS_KEPT``): a reload of the page that showed
#: a secret re-sends its form, which must not add a second endpoint or rotate again.
FORM_TOKENS_KEY, FORM_TOKENS_KEPT = "notify_forms", 20


class FormTokenForm(forms.Form):
    """The one-time token a create or rotate form carries (absent: no guard, as the API)."""

    form_token = forms.UUIDField(required=False)


def _answered(request: HttpRequest, tenant: Tenant) -> tuple[str, str | None]:
    """``(token, endpoint id or None)``: the form's token ("" without one, 400 naming
    ``form_token`` when malformed) and the endpoint an earlier post of it created or
    rotated."""
    form = FormTokenForm(request.POST)
    _require_valid(form)
    token = form.cleaned_data["form_token"]
    if token is None:
        return "", None
    seen = request.session.get(FORM_TOKENS_KEY, {})
    return f"{tenant.slug}/{token}", seen.get(f"{tenant.slug}/{token}")


def _remember(request: HttpRequest, token: str, endpoint_id) -> None:
    if token:
        seen = dict(list(request.session.get(FORM_TOKENS_KEY, {}).items())[-FORM_TOKENS_KEPT + 1:])
        seen[token] = str(endpoint_id)
        request.session[FORM_TOKENS_KEY] = seen


def _already(tenant: Tenant, endpoint_id: str, request: HttpRequest) -> HttpResponse:
    messages.info(request, "This form was already sent (a reload?): nothing was done again. "
                           "A secret is shown once; rotate it for a new one.")
    return see_other("notification_detail", slug=tenant.slug, endpoint_id=endpoint_id)


class DeleteForm(forms.Form):
    """Deleting an endpoint drops its delivery log and pending messages: a ticked box."""

    confirm = forms.BooleanField(
        error_messages={"required": "tick the box to confirm deleting the endpoint"})


def _shown(endpoint) -> dict:
    """The endpoint as the selector dressed it for the caller (``url``, ``email`` and
    ``secret_hint`` blank below the tenant's admin; ``destination`` for everyone)."""
    return {
        "uuid": endpoint.uuid, "name": endpoint.name, "channel": endpoint.channel,
        "destination": endpoint.destination,
        "url": endpoint.url, "email": endpoint.email, "secret_hint": endpoint.secret_hint,
        "event_types": list(endpoint.event_types), "kinds": list(endpoint.kinds),
        "agents": list(endpoint.agents), "services": list(endpoint.services),
        "group_window_s": endpoint.group_window_s, "quiet_period_s": endpoint.quiet_period_s,
        "enabled": endpoint.enabled, "disabled_reason": endpoint.disabled_reason,
        "disabled_at": endpoint.disabled_at, "failing_since": endpoint.failing_since,
        "last_sent_at": endpoint.last_sent_at,
        "previous_secret_until": endpoint.previous_secret_until,
        "created_by": endpoint.created_by_name, "created_at": endpoint.created_at,
    }


def _values(shown: dict) -> dict:
    """An endpoint's values as its edit form shows them (filters one a line)."""
    return shown | {f: "\n".join(shown[f]) for f in ("kinds", "agents", "services")}


def _body(post, *, channel: str, partial: bool) -> dict:
    """The API's body from a create or edit form (the service validates it). Filters are
    one value a line, each line as typed, spaces kept (an empty line is dropped: no value
    is empty; a line of spaces is a value, as a run's agent may be), so a value the API
    stored comes back unchanged; a number is read as the API reads it
    (``typed.typed_number``: ``"60\x0b"`` is sent as typed and refused, never read as
    60), a blank one left out (the default, or unchanged).
    ``partial`` (edit): only the fields the form sent (``event_types_sent`` marks the
    checkboxes, which send nothing when none is ticked)."""
    body: dict = {}
    if "name" in post or not partial:
        body["name"] = post.get("name", "")
    if not partial:
        body["channel"] = channel
    target = "email" if channel == NotificationChannel.EMAIL else "url"
    if target in post or not partial:
        # Only what a paste adds around a URL or an address (JSON's whitespace: space,
        # tab, CR, LF); anything else reaches the service as typed and is refused there
        # in the API's words (str.strip() dropped a VT, NEL or U+3000 the API refuses:
        # stop 36's attack).
        body[target] = post.get(target, "").strip(JSON_WHITESPACE)
    if "event_types_sent" in post or not partial:
        body["event_types"] = post.getlist("event_types")
    for field in ("kinds", "agents", "services"):
        if field in post:
            body[field] = [v for v in _LINES.split(post[field]) if v]
    for field in ("group_window_s", "quiet_period_s"):
        number = typed_number(post.get(field, ""))
        if number is not None:
            body[field] = number
    if post.get("enabled") in ("true", "false"):
        body["enabled"] = post["enabled"] == "true"
    return body


def _form_context(request: HttpRequest, tenant: Tenant) -> dict:
    return _base_context(request, tenant, "notifications") | {
        "event_types": NotificationEventType.SUBSCRIBABLE,
        "channels": NotificationChannel.choices, "window_default": GROUP_WINDOW_S_DEFAULT,
        "deliveries_max": DELIVERIES_MAX, "runs_linked": RUNS_LINKED,
        "form_token": uuid.uuid4(),
        "filter_fields": (("kinds", "Kinds"), ("agents", "Agents / workflows"),
                          ("services", "Services")),
    }


def _list_page(request: HttpRequest, tenant: Tenant, *, form: dict | None = None,
               error: tuple[str, str] | None = None, status: int = 200) -> HttpResponse:
    rows = selectors.notification_endpoint_list(user=request.user, tenant=tenant)
    context = _form_context(request, tenant) | {
        "endpoints": [_shown(e) for e in rows],
        "form": form or {"channel": NotificationChannel.WEBHOOK,
                         "event_types": [NotificationEventType.RUN_NEEDS_REVIEW]},
        "error": error}
    return render(request, "checkpoints/notifications.html", context, status=status)


def _endpoint_page(request: HttpRequest, tenant: Tenant, endpoint_id, *,
                   new_secret: str = "", form: dict | None = None,
                   error: tuple[str, str] | None = None, status: int = 200) -> HttpResponse:
    endpoint, rows = selectors.notification_deliveries(user=request.user, tenant=tenant,
                                                       endpoint_id=endpoint_id)
    shown = _shown(endpoint)
    context = _form_context(request, tenant) | {
        "endpoint": shown, "form": form or _values(shown), "error": error,
        "new_secret": new_secret, "deliveries": [_message(m) for m in rows]}
    return render(request, "checkpoints/notification_endpoint.html", context, status=status)


def _message(message) -> dict:
    """A message of the delivery log as the page shows it (the API's fields, and for a
    grouped message its run count and first runs from its payload: ids only)."""
    runs, count = message.listed_runs, message.run_count
    return {"event_id": message.event_id, "event_type": message.event_type,
            "subject": message.subject, "state": message.state,
            "attempts": message.attempts, "created_at": message.created_at,
            "delivered_at": message.delivered_at, "last_error": message.last_error,
            "next_attempt_at": (message.next_attempt_at
                                if message.state == DeliveryState.PENDING else None),
            "attempt_log": message.attempt_list, "run_count": count,
            "runs": runs, "more": max(0, count - len(runs)) if count is not None else 0,
            "incident": message.in_incident}


def _refused(exc: DomainError, request: HttpRequest) -> tuple[str, str] | None:
    """``(field, message)`` to show beside the form, or None to let ``@dashboard``
    answer (``common.form_refusal``)."""
    return form_refusal(exc, request, REFUSAL_FIELDS)


@require_safe
@dashboard
@tenant_page()
def notification_list(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/notifications/``: the tenant's endpoints (every role; a non-admin
    sees each destination's scheme and host or domain only) and, for its admin, the
    form that adds one. Takes no parameter; a GET writes nothing."""
    NoQuery.from_request(request)
    return _list_page(request, tenant)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def notification_create(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/notifications/new/`` (the admin's form): ``services.
    endpoint_create``. A webhook's page is rendered at once with its signing secret,
    shown this once (200; never in a URL or the session); another channel redirects
    (303) to its page. A refusal renders the list with the error beside its field."""
    token, done = _answered(request, tenant)
    if done:
        return _already(tenant, done, request)
    channel = request.POST.get("channel", "")
    body = _body(request.POST, channel=channel, partial=False)
    try:
        endpoint, secret = services.endpoint_create(actor=request.user, tenant=tenant,
                                                    body=body)
    except DomainError as exc:
        error = _refused(exc, request)
        if error is None:
            raise
        form = dict(request.POST.items()) | {"event_types": request.POST.getlist("event_types")}
        return _list_page(request, tenant, form=form, error=error, status=exc.status)
    _remember(request, token, endpoint.uuid)
    if secret:
        return _endpoint_page(request, tenant, endpoint.uuid, new_secret=secret)
    messages.success(request, f"Endpoint {endpoint.name!r} added (audited).")
    return see_other("notification_detail", slug=tenant.slug, endpoint_id=str(endpoint.uuid))


@require_safe
@dashboard
@tenant_page()
def notification_detail(request: HttpRequest, tenant: Tenant, endpoint_id: str) -> HttpResponse:
    """``/t/<slug>/notifications/<uuid>/``: one endpoint and its delivery log (the
    newest 100 messages with every attempt: status, latency, the answer's first
    characters); the admin's forms. Takes no parameter; a GET writes nothing."""
    NoQuery.from_request(request)
    return _endpoint_page(request, tenant, endpoint_id)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def notification_update(request: HttpRequest, tenant: Tenant, endpoint_id: str) -> HttpResponse:
    """``POST …/<uuid>/edit/``: ``services.endpoint_update`` with the fields the form
    sent (PATCH semantics: the edit form sends them all, "enable"/"disable" only
    ``enabled``). 303 back to the page; a refusal renders it with the error beside its
    field."""
    endpoint = selectors.notification_endpoint_get(user=request.user, tenant=tenant,
                                                   endpoint_id=endpoint_id)
    body = _body(request.POST, channel=endpoint.channel, partial=True)
    try:
        services.endpoint_update(actor=request.user, tenant=tenant, endpoint_id=endpoint.uuid,
                                 body=body)
    except DomainError as exc:
        error = _refused(exc, request)
        if error is None:
            raise
        form = (_values(_shown(endpoint)) | dict(request.POST.items())
                | {"event_types": request.POST.getlist("event_types")})
        return _endpoint_page(request, tenant, endpoint.uuid, form=form, error=error,
                              status=exc.status)
    words = {True: "enabled", False: "disabled"}.get(body.get("enabled")) if len(body) == 1 \
        else None
    messages.success(request, f"Endpoint {words or 'saved'} (audited).")
    return see_other("notification_detail", slug=tenant.slug, endpoint_id=str(endpoint.uuid))


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def notification_rotate(request: HttpRequest, tenant: Tenant, endpoint_id: str) -> HttpResponse:
    """``POST …/<uuid>/rotate/``: ``services.endpoint_rotate_secret``; the page is
    rendered with the new secret, shown this once (the previous one signs for 24 h)."""
    token, done = _answered(request, tenant)
    if done:
        return _already(tenant, done, request)
    endpoint, secret = services.endpoint_rotate_secret(actor=request.user, tenant=tenant,
                                                       endpoint_id=endpoint_id)
    _remember(request, token, endpoint.uuid)
    return _endpoint_page(request, tenant, endpoint.uuid, new_secret=secret)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def notification_delete(request: HttpRequest, tenant: Tenant, endpoint_id: str) -> HttpResponse:
    """``POST …/<uuid>/delete/`` with ``confirm`` ticked: ``services.endpoint_delete``
    (its delivery log goes too); 303 to the list. Unticked: 400 naming ``confirm``."""
    _require_valid(DeleteForm(request.POST))
    services.endpoint_delete(actor=request.user, tenant=tenant, endpoint_id=endpoint_id)
    messages.success(request, "Endpoint deleted with its delivery log (audited).")
    return see_other("notification_list", slug=tenant.slug)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def notification_send_test(request: HttpRequest, tenant: Tenant,
                           endpoint_id: str) -> HttpResponse:
    """``POST …/<uuid>/test/``: ``services.notification_test`` (a ``test`` message,
    due now); 303 back to the page, where the delivery log shows it."""
    message = services.notification_test(actor=request.user, tenant=tenant,
                                         endpoint_id=endpoint_id)
    messages.success(request, f"Test event {message.event_id} queued; the delivery log "
                              "below shows each attempt.")
    return see_other("notification_detail", slug=tenant.slug, endpoint_id=endpoint_id)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def notification_resend(request: HttpRequest, tenant: Tenant, endpoint_id: str,
                        event_id: str) -> HttpResponse:
    """``POST …/<uuid>/deliveries/<event_id>/resend/``: ``services.notification_resend``
    (the same event id, due now); 303 back to the page."""
    message = services.notification_resend(actor=request.user, tenant=tenant,
                                           endpoint_id=endpoint_id, event_id=event_id)
    messages.success(request, f"Message {message.event_id} will be sent again (same id).")
    return see_other("notification_detail", slug=tenant.slug, endpoint_id=endpoint_id)
