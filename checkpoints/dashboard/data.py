"""The Data page (issue 20; docs/security/retention.md): the tenant's data policy (its
admin edits it here through ``services.data_policy_set``, as ``PUT …/data-policy``),
the tombstones deletions left (newest first, a page at a time), the active legal holds
and the erasure requests. Any role of the tenant reads it (``selectors.lifecycle``: ids,
numbers, reasons and names, never a payload value; what the page shows the API shows).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from .. import roles, selectors, services
from ..exceptions import DomainError
from ..models import Tenant
from .common import (
    _base_context,
    dashboard,
    form_refusal,
    require_POST,
    require_safe,
    see_other,
    tenant_page,
)
from .forms import TombstonePageForm
from .typed import POLICY_NUMBERS, policy_fields, subject_line

#: Where the policy form shows a service's refusal: the field its message names.
POLICY_FORM_FIELDS = {name: name for name in (*POLICY_NUMBERS, "secrets_policy",
                                              "subject_fields")}


def _subject_lines(fields: dict[str, str]) -> list[str]:
    """The policy's subject fields as the form shows them and reads them back (one
    ``name = pointer`` a line, a pointer stored before the one-line rule as an escaped
    JSON string: ``typed.subject_line``); the table of the other roles shows the same."""
    return [subject_line(name, pointer) for name, pointer in fields.items()]


def _page(request: HttpRequest, tenant: Tenant, *, before: int | None = None,
          form: dict | None = None, error: tuple[str, str] | None = None,
          status: int = 200) -> HttpResponse:
    """The whole Data page, the tombstones below ``before`` (None: from the newest): the
    policy form shows ``form`` (the values as typed, after a refusal) over the stored
    policy, with ``error`` (``(field, message)``) beside its field."""
    user = request.user
    policy = selectors.data_policy_get(user=user, tenant=tenant)
    stored = policy.subject_fields or {}
    lines = _subject_lines(stored)
    shown = {name: "" if getattr(policy, name) is None else str(getattr(policy, name))
             for name in POLICY_NUMBERS}
    shown |= {"secrets_policy": policy.secrets_policy, "subject_fields": "\n".join(lines)}
    context = _base_context(request, tenant, "data") | {
        "stones": selectors.tombstone_page(user=user, tenant=tenant, before=before),
        "before": before,
        "policy": policy,
        "policy_set": not policy._state.adding,
        "form": shown | (form or {}), "error": error,
        "subject_lines": lines,
        # A pointer stored before the one-line rule is shown quoted and escaped: the help
        # text says why only when the policy holds one (most never do).
        "old_pointers": any(services.subject_pointer_problem(p) for p in stored.values()),
        "holds": selectors.legal_hold_list(user=user, tenant=tenant, active_only=True,
                                           limit=selectors.HOLDS_SHOWN),
        "erasures": selectors.erasure_request_list(user=user, tenant=tenant,
                                                   limit=selectors.ERASURES_SHOWN),
        "holds_max": selectors.HOLDS_SHOWN, "erasures_max": selectors.ERASURES_SHOWN,
    }
    return render(request, "checkpoints/data.html", context, status=status)


@require_safe
@dashboard
@tenant_page()
def data_page(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``/t/<slug>/data/[?before=N]``: the policy (a form for the tenant's admin, a
    table for everyone else), the tombstones with an id below ``before`` (newest first,
    ``selectors.TOMBSTONE_PAGE`` a page; an htmx request for the next page gets the
    ``tombstones`` fragment only), the active legal holds and the latest erasure
    requests. A GET: nothing written."""
    before = TombstonePageForm.from_request(request).cleaned_data["before"]
    if request.htmx and before is not None:
        stones = selectors.tombstone_page(user=request.user, tenant=tenant, before=before)
        context = _base_context(request, tenant, "data") | {"stones": stones, "before": before}
        return render(request, "checkpoints/data.html#tombstones", context)
    return _page(request, tenant, before=before)


@require_POST
@dashboard
@tenant_page(roles.MANAGE)
def data_policy_post(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    """``POST /t/<slug>/data/policy/`` (the Data page's form), the tenant's admin only
    (other roles 403, no role 404): the form's fields as the API's body
    (``typed.policy_fields``), judged and written by ``services.data_policy_set``, then
    303 back to the page saying whether anything changed. A refusal (``InvalidPayload``
    naming the field, in the service's words, the API's) renders the Data page again,
    400, the form showing what was typed and the error beside its field; nothing
    written."""
    try:
        _, changed = services.data_policy_set(actor=request.user, tenant=tenant,
                                              **policy_fields(request.POST))
    except DomainError as exc:
        error = form_refusal(exc, request, POLICY_FORM_FIELDS)
        if error is None:
            raise
        typed = {name: request.POST[name] for name in POLICY_FORM_FIELDS if name in request.POST}
        return _page(request, tenant, form=typed, error=error, status=exc.status)
    messages.success(request, "Data policy saved (audited)." if changed
                     else "The data policy already had these values: nothing changed.")
    return see_other("data_page", slug=tenant.slug)
