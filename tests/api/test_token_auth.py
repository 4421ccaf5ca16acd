"""``api.auth.token_user``, the API's one-query token look-up (issue 8), answers exactly
as ``services.token_authenticate`` and leaves the token's bookkeeping write to it."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints import services
from checkpoints.api.auth import token_user
from checkpoints.models import ApiToken


def _writes(ctx) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries
            if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]


def test_it_answers_as_the_service_for_every_kind_of_token(acme, wendy, vic):
    live, revoked, other = (services.token_issue(user=u) for u in (wendy, vic, vic))
    services.tokens_revoke(user=vic)
    gone = services.token_issue(user=vic)
    services.account_deactivate(user=vic)
    for raw in (live, revoked, other, gone, "rcv_unknown", "rcv_\u00e9t\u00e9", "", 7):
        assert token_user(raw) == services.token_authenticate(raw), raw
    user = token_user(live)
    assert (user.pk, user.username, user.is_active) == (wendy.pk, "wendy", True)
    assert user.date_joined == wendy.date_joined  # converted like the ORM's
    assert not hasattr(user, "token_db_now")


def test_it_reads_in_one_query_and_leaves_the_note_of_use_to_the_service(acme, wendy):
    raw = services.token_issue(user=wendy)
    with CaptureQueriesContext(connection) as first:
        assert token_user(raw) == wendy
    assert len(_writes(first)) == 1  # never used: the service notes last_used_at
    with CaptureQueriesContext(connection) as again:
        assert token_user(raw) == wendy
    assert len(again.captured_queries) == 1 and not _writes(again)
    token = ApiToken.objects.get(user=wendy)
    ApiToken.objects.filter(pk=token.pk).update(
        last_used_at=token.last_used_at - services.TOKEN_TOUCH_INTERVAL - timedelta(seconds=1))
    with CaptureQueriesContext(connection) as due:
        assert token_user(raw) == wendy
    assert len(_writes(due)) == 1  # a minute later: noted again, by the service
