"""Brute-force defence at the dashboard login and at /admin/login/ (issue 6, fault 5).

django-axes locks out per account and per address after ``AXES_FAILURE_LIMIT`` failures
(5 here): every later attempt, the right password included, gets the lockout page (429)
and is refused before any password is hashed, until the cool-off has passed or an
operator runs ``axes_reset_username``. The address is ``REMOTE_ADDR`` unless trusted
proxies are configured, so a forged ``X-Forwarded-For`` buys nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.hashers import get_hasher
from django.core.management import call_command
from django.db.models import F, Sum
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse

from checkpoints.ops.security import client_ip
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

LOGIN = reverse("login")
ADMIN_LOGIN = "/admin/login/"
LIMIT = settings.AXES_FAILURE_LIMIT


def attempt(url, username, password, ip="127.0.0.1", client=None, **extra):
    client = client or Client()
    response = client.post(url, {"username": username, "password": password,
                                 "next": "/admin/" if url == ADMIN_LOGIN else ""},
                           REMOTE_ADDR=ip, **extra)
    return client, response


def logged_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def stella(django_user_model, db):
    """An account that may use the admin (its login is what /admin/login/ guards)."""
    return django_user_model.objects.create_user("stella", password=PASSWORD, is_staff=True,
                                                 is_superuser=True)


@pytest.fixture
def hashes(monkeypatch):
    """Counts the passwords hashed: checking a stored hash and hashing a new one both go
    through the configured hasher's ``encode`` (once per login attempt that reaches it)."""
    counter = {"n": 0}
    hasher = type(get_hasher())
    encode = hasher.encode

    def counting_encode(self, *args, **kwargs):
        counter["n"] += 1
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(hasher, "encode", counting_encode)
    return counter


def test_the_failure_limit_is_small():
    assert 1 <= LIMIT <= 10


@pytest.mark.parametrize(("url", "username"), [(LOGIN, "rita"), (ADMIN_LOGIN, "stella")])
def test_the_right_password_logs_in_when_nobody_guessed(url, username, rita, stella):
    client, response = attempt(url, username, PASSWORD)
    assert response.status_code == 302 and logged_in(client)


@pytest.mark.parametrize(("url", "username"), [(LOGIN, "rita"), (ADMIN_LOGIN, "stella")])
def test_sixty_wrong_passwords_then_the_right_one_does_not_log_in(url, username, rita, stella):
    statuses = [attempt(url, username, f"wrong-guess-{i}")[1].status_code for i in range(60)]
    assert statuses[:LIMIT - 1] == [200] * (LIMIT - 1)  # the form says "did not match"
    assert set(statuses[LIMIT - 1:]) == {429}
    client, response = attempt(url, username, PASSWORD)
    assert response.status_code == 429
    assert not logged_in(client)
    assert client.get(reverse("inbox")).status_code == 302  # still sent to the login


def test_fewer_failures_than_the_limit_still_let_the_right_password_in(rita):
    for i in range(LIMIT - 1):
        attempt(LOGIN, "rita", f"typo-{i}")
    client, response = attempt(LOGIN, "rita", PASSWORD)
    assert response.status_code == 302 and logged_in(client)


@pytest.mark.parametrize("url", [LOGIN, ADMIN_LOGIN])
def test_the_lockout_page_says_what_happened_and_how_long(url, rita):
    for i in range(LIMIT):
        _, response = attempt(url, "rita", f"wrong-{i}")
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed logins" in page
    assert "as <strong>rita</strong>, or from your address" in page
    assert f"after {LIMIT} failed attempts" in page
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    assert f"Try again in {minutes} minutes" in page
    assert "axes_reset_username" in page


def test_an_address_guessing_many_accounts_is_locked_for_every_account(rita, april):
    for i in range(LIMIT):
        attempt(LOGIN, f"nobody-{i}", "wrong-password", ip="10.0.0.1")
    client, response = attempt(LOGIN, "rita", PASSWORD, ip="10.0.0.1")
    assert response.status_code == 429 and not logged_in(client)
    client, response = attempt(LOGIN, "april", PASSWORD, ip="10.0.0.2")
    assert response.status_code == 302 and logged_in(client)


def test_an_account_guessed_from_many_addresses_is_locked_from_every_address(rita, april):
    for i in range(LIMIT):
        attempt(LOGIN, "rita", "wrong-password", ip=f"10.0.1.{i + 1}")
    client, response = attempt(LOGIN, "rita", PASSWORD, ip="10.0.2.1")
    assert response.status_code == 429 and not logged_in(client)
    client, response = attempt(LOGIN, "april", PASSWORD, ip="10.0.2.1")
    assert response.status_code == 302 and logged_in(client)


def test_a_locked_out_attempt_hashes_no_password_and_records_nothing(rita, hashes):
    for i in range(LIMIT):
        attempt(LOGIN, "rita", f"wrong-{i}")
    assert hashes["n"] == LIMIT  # each counted failure checked the password once
    failures = AccessAttempt.objects.aggregate(n=Sum("failures_since_start"))["n"]
    assert failures == LIMIT
    for password in ["wrong-again"] * 20 + [PASSWORD]:
        assert attempt(LOGIN, "rita", password)[1].status_code == 429
    assert hashes["n"] == LIMIT
    assert AccessAttempt.objects.aggregate(n=Sum("failures_since_start"))["n"] == failures


def test_unknown_usernames_are_locked_out_by_address_before_hashing(db, hashes):
    for i in range(LIMIT):
        attempt(LOGIN, f"ghost-{i}", "wrong-password", ip="10.0.5.1")
    assert hashes["n"] == LIMIT  # Django hashes for unknown users too (timing)
    for i in range(10):
        assert attempt(LOGIN, f"other-{i}", "x", ip="10.0.5.1")[1].status_code == 429
    assert hashes["n"] == LIMIT


def test_a_forged_forwarded_for_header_does_not_escape_the_address_lockout(rita):
    for i in range(LIMIT):
        attempt(LOGIN, f"nobody-{i}", "wrong-password", ip="10.0.3.1",
                HTTP_X_FORWARDED_FOR=f"203.0.113.{i}")
    client, response = attempt(LOGIN, "rita", PASSWORD, ip="10.0.3.1",
                               HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert response.status_code == 429 and not logged_in(client)


def test_the_lockout_ends_after_the_cool_off(rita):
    for i in range(LIMIT):
        attempt(LOGIN, "rita", f"wrong-{i}")
    assert attempt(LOGIN, "rita", PASSWORD)[1].status_code == 429
    # Let the cool-off pass: age every recorded failure by it (plus a second).
    AccessAttempt.objects.update(
        attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    client, response = attempt(LOGIN, "rita", PASSWORD)
    assert response.status_code == 302 and logged_in(client)


def test_an_operator_unlocks_an_account_with_axes_reset_username(rita):
    for i in range(LIMIT):
        attempt(LOGIN, "rita", f"wrong-{i}")
    assert attempt(LOGIN, "rita", PASSWORD)[1].status_code == 429
    call_command("axes_reset_username", "rita", stdout=open("/dev/null", "w"))
    client, response = attempt(LOGIN, "rita", PASSWORD)
    assert response.status_code == 302 and logged_in(client)


@pytest.mark.parametrize("url", [LOGIN, ADMIN_LOGIN])
@pytest.mark.parametrize("username", ["r" * 300, "ri\x00ta", "é" * 200])
def test_hostile_usernames_are_refused_by_the_form_never_a_500(url, username, rita):
    client, response = attempt(url, username, "wrong-password",
                               HTTP_USER_AGENT="agent/" + "x" * 2000)
    assert response.status_code == 200 and not logged_in(client)


def test_an_overlong_username_is_still_locked_out(rita):
    for _ in range(LIMIT):
        attempt(LOGIN, "r" * 300, "wrong-password", ip="10.0.6.1")
    assert attempt(LOGIN, "r" * 300, "wrong-password", ip="10.0.6.2")[1].status_code == 429


# --- which address is counted ------------------------------------------------------------

def _request(remote="192.0.2.10", forwarded=None):
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return RequestFactory().post(LOGIN, REMOTE_ADDR=remote, **extra)


def test_without_trusted_proxies_the_address_is_the_peer_address():
    assert client_ip(_request(forwarded="203.0.113.9, 198.51.100.1")) == "192.0.2.10"


@pytest.mark.parametrize(("proxies", "forwarded", "expected"), [
    (1, "203.0.113.9", "203.0.113.9"),
    (1, "6.6.6.6, 203.0.113.9", "203.0.113.9"),  # the client's own prefix is ignored
    (2, "6.6.6.6, 203.0.113.9, 10.1.1.1", "203.0.113.9"),
    (2, "203.0.113.9", "192.0.2.10"),  # fewer hops than proxies: the peer address
    (1, "", "192.0.2.10"),
    (1, "not-an-address", "192.0.2.10"),
    (1, "2001:db8::1", "2001:db8::1"),
])
def test_behind_trusted_proxies_the_address_is_the_one_the_outermost_proxy_saw(
        proxies, forwarded, expected):
    with override_settings(RECOVERY_TRUSTED_PROXY_COUNT=proxies):
        assert client_ip(_request(forwarded=forwarded)) == expected
