"""Endpoint management (issue 21, item 1): validation naming the field, admin only,
secrets shown once and never audited."""

from __future__ import annotations

import pytest

from checkpoints import services
from checkpoints.exceptions import Forbidden, InvalidPayload, InvalidTransition, NotFound
from checkpoints.models import AuditEvent, NotificationEndpoint
from checkpoints.models.notifications import ENDPOINTS_PER_TENANT_MAX

pytestmark = pytest.mark.django_db

GOOD = {"name": "on-call", "channel": "webhook", "url": "https://hooks.example.com/h/T0K3N",
        "event_types": ["run.needs_review", "retry.awaiting_approval"]}


@pytest.mark.parametrize(("change", "field"), [
    ({"channel": "pager"}, "channel"),
    ({"url": "http://hooks.example.com/"}, "url"),  # plain http not allowed by default
    ({"url": "https://u:p@hooks.example.com/"}, "url"),
    ({"url": "https://10.0.0.1/"}, "url"),
    ({"url": "https://localhost/"}, "url"),
    ({"url": "https://" + "a" * 2048 + ".com/"}, "url"),
    ({"url": "https://ex ample.com/"}, "url"),
    ({"url": "https://hooks.example.com:0/"}, "url"),  # stop 34: was sent to 443
    ({"url": 7}, "url"),
    ({"email": "x@example.com"}, "email"),
    ({"event_types": []}, "event_types"),
    ({"event_types": ["test"]}, "event_types"),
    ({"event_types": "run.needs_review"}, "event_types"),
    ({"kinds": ["ok", "bad\x07"]}, "kinds"),
    ({"kinds": ["k"] * 51}, "kinds"),
    ({"agents": ["a" * 257]}, "agents"),  # Run.agent and Run.workflow hold 256
    ({"kinds": ["k" * 201]}, "kinds"),  # Run.kind holds 200
    ({"services": [""]}, "services"),
    ({"group_window_s": 3601}, "group_window_s"),
    ({"group_window_s": True}, "group_window_s"),
    ({"quiet_period_s": -1}, "quiet_period_s"),
    ({"quiet_period_s": 86_401}, "quiet_period_s"),
    ({"name": ""}, "name"),
    ({"name": "x" * 101}, "name"),
    ({"name": "a\x00b"}, "name"),
    ({"enabled": "yes"}, "enabled"),
    ({"secret": "whsec_mine"}, "secret"),
])
def test_bad_input_names_the_field_and_writes_nothing(acme, adam, change, field):
    with pytest.raises(InvalidPayload) as err:
        services.endpoint_create(actor=adam, tenant=acme, body={**GOOD, **change})
    assert str(err.value.detail).startswith(f"{field}:")
    assert "T0K3N" not in str(err.value.detail)
    assert not NotificationEndpoint.objects.for_tenant(acme).exists()


def test_email_endpoint_needs_a_valid_address(acme, adam):
    body = {"name": "m", "channel": "email", "event_types": ["digest"]}
    with pytest.raises(InvalidPayload, match="^email: not a valid"):
        services.endpoint_create(actor=adam, tenant=acme, body={**body, "email": "nope"})
    endpoint, secret = services.endpoint_create(actor=adam, tenant=acme,
                                                body={**body, "email": "ops@example.com"})
    assert secret == "" and endpoint.email == "ops@example.com"


def test_only_an_admin_manages_endpoints(acme, adam, rita, april, vic):
    for user in (rita, april, vic):
        with pytest.raises((Forbidden, NotFound)):
            services.endpoint_create(actor=user, tenant=acme, body=GOOD)
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body=GOOD)
    for user in (rita, vic):
        with pytest.raises((Forbidden, NotFound)):
            services.endpoint_rotate_secret(actor=user, tenant=acme, endpoint_id=endpoint.uuid)


def test_another_tenants_endpoint_is_not_found(acme, adam, globex):
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body=GOOD)
    boss = services.account_create(username="gadmin", password=None)
    services.role_grant(actor=None, tenant=globex, user=boss, role="admin")
    with pytest.raises(NotFound):
        services.endpoint_delete(actor=boss, tenant=globex, endpoint_id=endpoint.uuid)


def test_the_secret_is_stored_encrypted_and_never_audited(acme, adam):
    endpoint, secret = services.endpoint_create(actor=adam, tenant=acme, body=GOOD)
    endpoint, rotated = services.endpoint_rotate_secret(actor=adam, tenant=acme,
                                                        endpoint_id=endpoint.uuid)
    stored = NotificationEndpoint.objects.for_tenant(acme).get()
    assert secret not in stored.secret and rotated not in stored.secret
    assert services.notify_endpoints.secret_hint(stored) == f"whsec_…{rotated[-4:]}"
    events = AuditEvent.objects.for_tenant(acme).filter(target_ref=str(endpoint.uuid))
    text = repr([(e.before, e.after, e.reason) for e in events])
    assert len(events) == 2
    for hidden in (secret, rotated, secret[6:], "T0K3N", "/h/"):
        assert hidden not in text
    assert "https://hooks.example.com" in text


def test_update_changes_only_what_is_sent_and_channel_is_fixed(acme, adam):
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body=GOOD)
    changed = services.endpoint_update(actor=adam, tenant=acme, endpoint_id=endpoint.uuid,
                                       body={"kinds": ["acme.order"], "group_window_s": 0})
    assert changed.kinds == ["acme.order"] and changed.group_window_s == 0
    assert changed.url == GOOD["url"]
    with pytest.raises(InvalidPayload, match="^channel: cannot be changed"):
        services.endpoint_update(actor=adam, tenant=acme, endpoint_id=endpoint.uuid,
                                 body={"channel": "slack"})
    event = AuditEvent.objects.for_tenant(acme).order_by("-seq").first()
    assert event.before == {"kinds": [], "group_window_s": 120}
    assert event.after == {"kinds": ["acme.order"], "group_window_s": 0}


def test_rotation_is_for_webhooks_and_resend_for_ended_messages(acme, adam):
    slack, _ = services.endpoint_create(actor=adam, tenant=acme, body={
        **GOOD, "channel": "slack"})
    with pytest.raises(InvalidTransition):
        services.endpoint_rotate_secret(actor=adam, tenant=acme, endpoint_id=slack.uuid)
    message = services.notification_test(actor=adam, tenant=acme, endpoint_id=slack.uuid)
    with pytest.raises(InvalidTransition, match="^state: the message is pending"):
        services.notification_resend(actor=adam, tenant=acme, endpoint_id=slack.uuid,
                                     event_id=message.event_id)
    with pytest.raises(NotFound):
        services.notification_resend(actor=adam, tenant=acme, endpoint_id=slack.uuid,
                                     event_id="msg_nope")


def test_a_tenant_has_a_bounded_number_of_endpoints(acme, adam, settings):
    for n in range(ENDPOINTS_PER_TENANT_MAX):
        services.endpoint_create(actor=adam, tenant=acme, body={**GOOD, "name": f"e{n}"})
    with pytest.raises(InvalidPayload, match="at most 50"):
        services.endpoint_create(actor=adam, tenant=acme, body=GOOD)


def test_delete_removes_the_endpoint_and_its_messages(acme, adam):
    endpoint, _ = services.endpoint_create(actor=adam, tenant=acme, body=GOOD)
    services.notification_test(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    services.endpoint_delete(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
    assert not NotificationEndpoint.objects.for_tenant(acme).exists()
    with pytest.raises(NotFound):
        services.endpoint_delete(actor=adam, tenant=acme, endpoint_id=endpoint.uuid)
