"""The OpenAPI schema agrees with the API (issue 6, fault 7): schemathesis against
``/api/schema/``, bounded and derandomized, in both database passes.

For every operation, as a writer and as a reviewer of a seeded tenant: generated valid
requests (positive) and invalid ones (negative: wrong types, out-of-range values,
missing required fields), each sent through the real WSGI handler (middlewares,
exception handlers, handler500) on the test database. Every answer must be documented
(status code, content type, body schema, required headers), never a 5xx, and invalid
input must be refused with a 4xx. A stateful phase then chains operations through the
links schemathesis infers (a PUT's id into the GETs, a run id into its actions).

Not asserted: ``positive_data_acceptance`` (a valid request may be refused by design:
a stale revision is 412, an unknown id 404, a write without a precondition header 428).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from checkpoints import services
from checkpoints.exceptions import StaleRevision
from checkpoints.models import Run
from tests.helpers import effect_body, envelope, put_checkpoint, put_effect, sweep_later

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis is not installed: pip install -e '.[test]'")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.core.failures import FailureGroup  # noqa: E402

#: Generated requests per operation and mode (positive, negative). Bounded so that the
#: module runs in about a minute per database pass; raise it for a deeper local run.
MAX_EXAMPLES = int(os.environ.get("RECOVERY_SCHEMATHESIS_EXAMPLES", "10"))
#: Scenarios of the stateful phase (each up to 8 linked calls).
STATEFUL_EXAMPLES = int(os.environ.get("RECOVERY_SCHEMATHESIS_SCENARIOS", "10"))
#: Checks that do not hold by design (see the module doc).
NOT_CHECKED = {"positive_data_acceptance"}


def wsgi_app() -> Callable:
    """Django's real WSGI handler, minus the end-of-request connection close, so the
    requests run inside this test's database transaction (as Django's test client does)."""
    handler = WSGIHandler()

    def app(environ, start_response):
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = handler(environ, start_response)
            try:
                body = b"".join(response)
            finally:
                response.close()
            return [body]
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)

    return app


@pytest.fixture
def seeded(acme, wendy, rita, april):
    """acme with runs in the states the answers must describe: awaiting approval (in
    flight, swept ambiguous, an effect reconciled then marked unknown, a refused write, a
    retry requested), closed, completed under a lease, and an unregistered kind
    (schema_mismatch); bearer tokens of its writer and its reviewer."""
    run_id = uuid.uuid4()
    body = envelope(run_id=run_id, payload={"phase": "ready", "order_id": "A-1"})
    put_checkpoint(wendy, acme, body)
    put_checkpoint(wendy, acme, dict(body, revision=1, payload={"phase": "charging"}),
                   expected=0)
    with pytest.raises(StaleRevision):  # kept as a conflict of the run
        put_checkpoint(wendy, acme, dict(body, revision=1), expected=0)
    fx = effect_body(run_id=run_id, receipt=None)
    put_effect(wendy, acme, fx)
    put_effect(wendy, acme, dict(fx, revision=1, state="submitted"), expected=0)
    sweep_later()
    services.run_reconcile(actor=rita, tenant=acme, run_id=run_id, reason="ask")
    services.effect_mark_unknown(actor=rita, tenant=acme, effect_id=uuid.UUID(fx["id"]),
                                 reason="no lookup")
    services.retry_request(actor=rita, tenant=acme, run_id=run_id, reason="retry it")

    closed = envelope(payload={"phase": "ready"})
    put_checkpoint(wendy, acme, closed)
    services.run_close(actor=rita, tenant=acme, run_id=uuid.UUID(closed["run_id"]),
                       reason="handled by hand")
    done = envelope(payload={"phase": "completed", "order_id": "A-2"})
    put_checkpoint(wendy, acme, done)
    services.lease_acquire(actor=wendy, tenant=acme, run_id=uuid.UUID(done["run_id"]),
                           owner="worker-1", ttl_s=600)
    fx2 = effect_body(run_id=done["run_id"], operation_key="charge:A-2")
    put_effect(wendy, acme, fx2, token=1)
    put_effect(wendy, acme, dict(fx2, revision=1, state="submitted"), expected=0, token=1)
    put_effect(wendy, acme, dict(fx2, revision=2, state="confirmed", receipt={"id": "ch_2"}),
               expected=1, token=1)
    put_checkpoint(wendy, acme, envelope(kind="zeta.thing", payload={"x": 1}))
    states = set(Run.objects.values_list("recovery_state", flat=True))
    assert states == {"awaiting_approval", "closed", "completed", "schema_mismatch"}, states
    return {"writer": services.token_issue(user=wendy),
            "reviewer": services.token_issue(user=rita)}


#: Operations of the writer role (a runtime's token); the reviewer's token calls the rest
#: (approve/reject then get their documented 403: the reviewer is not an approver).
WRITER_OPERATIONS = {"checkpoint_put", "effect_put", "run_lease", "run_resume_preview",
                     "run_resume_claim"}


def _excluded() -> list:
    from schemathesis.checks import CHECKS, load_all_checks

    load_all_checks()
    return CHECKS.get_by_names(sorted(NOT_CHECKED))


class Disagreements:
    """What the checks found, one entry per (operation, kind of failure), with a curl
    command that reproduces it."""

    def __init__(self, tokens: dict):
        self.tokens = tokens
        self.found: dict = {}
        self.excluded = _excluded()

    def headers(self, case) -> dict:
        role = "writer" if case.operation.definition.raw.get("operationId") in WRITER_OPERATIONS \
            else "reviewer"
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def validate(self, case, response=None, **kwargs) -> None:
        headers = self.headers(case)
        try:
            if response is None:
                case.call_and_validate(headers=headers, excluded_checks=self.excluded)
            else:
                case.validate_response(response, excluded_checks=self.excluded, headers=headers,
                                       transport_kwargs=kwargs)
        except FailureGroup as group:
            for failure in group.exceptions:
                self.found.setdefault((case.operation.label, failure.title),
                                      f"{failure.message}\n{case.as_curl_command(headers)}")

    def report(self) -> str:
        return f"{len(self.found)} disagreements:\n\n" + "\n\n".join(
            f"{op}: {title}\n{detail}" for (op, title), detail in self.found.items())


def _examples(operation, mode, found: Disagreements) -> None:
    """Fuzzing: ``MAX_EXAMPLES`` generated requests of ``mode`` (derandomized)."""
    strategy = operation.as_strategy(mode, path_parameters={"tenant": "acme"})

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        case.path_parameters["tenant"] = "acme"
        found.validate(case)

    run()


def _coverage(operation, found: Disagreements) -> None:
    """Coverage: schemathesis's deterministic boundary cases (each parameter and field at
    and past its limits, missing, of the wrong type, unexpected methods)."""
    from schemathesis.generation.hypothesis.builder import (
        HypothesisTestConfig,
        HypothesisTestMode,
        create_test,
    )

    def run(case):
        case.path_parameters["tenant"] = "acme"
        found.validate(case)

    create_test(operation=operation, test_func=run, config=HypothesisTestConfig(
        project=operation.schema.config, modes=[HypothesisTestMode.COVERAGE],
        settings=settings(derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))))()


def _load(tokens: dict):
    headers = {"Authorization": f"Bearer {tokens['reviewer']}"}
    return schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app(),
                                          headers=headers)


def _operations(schema) -> list:
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20  # every path and method of CONTRACT.md 3, and the report
    return operations


def test_the_api_answers_generated_requests_as_its_schema_says(seeded):
    """Fuzzing, positive and negative, of every operation as the role that may call it."""
    schema = _load(seeded)
    found = Disagreements(seeded)
    for operation in _operations(schema):
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _examples(operation, mode, found)
    assert not found.found, found.report()


def test_the_api_answers_boundary_requests_as_its_schema_says(seeded):
    """The coverage phase: limits, missing and wrong-typed values, other methods."""
    schema = _load(seeded)
    found = Disagreements(seeded)
    for operation in _operations(schema):
        _coverage(operation, found)
    assert not found.found, found.report()


def test_the_api_answers_linked_calls_as_its_schema_says(seeded):
    """The stateful phase: sequences of calls whose ids come from earlier answers (links
    schemathesis infers from the schema)."""
    schema = _load(seeded)
    found = Disagreements(seeded)
    base = schema.as_state_machine()

    class Machine(base):
        def before_call(self, case):
            case.path_parameters = {**(case.path_parameters or {}), "tenant": "acme"}

        def get_call_kwargs(self, case):
            return {"headers": found.headers(case)}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            found.validate(case, response, **kwargs)

    Machine.run(settings=settings(max_examples=STATEFUL_EXAMPLES, derandomize=True,
                                  database=None, deadline=None, stateful_step_count=8,
                                  suppress_health_check=list(HealthCheck)))
    assert not found.found, found.report()


# Database-independent, so `make test` runs it once, in the SQLite pass (`once`, not
# `matrix`, since stop 40: the PostgreSQL pass was the longer). Hypothesis's runs are the
# suite's longest tests (82 s and 72 s measured on a loaded 2-core machine): 900 s each,
# not the default 300 (pyproject.toml, pytest-timeout).
pytestmark = [pytest.mark.once, pytest.mark.timeout(900)]
