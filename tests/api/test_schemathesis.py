"""schemathesis against the API's own OpenAPI schema, in process through Django's WSGI
handler, as an admin with a token, on a seeded cluster (hosts, GPUs, links, a proposal, a
job, a cycle): every operation, positive and negative data, must give no server error and
only responses the schema describes (status, content type and body)."""
import hypothesis
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import override_settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from scheduler.models import AllocationCycle

from .conftest import propose

pytestmark = pytest.mark.django_db
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 5  # per operation and mode: 26 operations × 2 modes in about a minute


@pytest.fixture
def wsgi_app():
    """Django's WSGI handler, minus the per-request connection closing that Django's own test
    client also turns off (the test's transaction must survive each request)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@override_settings(API_WRITE_RATE="100000/min")
def test_the_api_conforms_to_its_schema(cluster, tenant, admin_caller, wsgi_app):
    propose(tenant)
    AllocationCycle.objects.create(pending_reasons={"no_capacity": 1})
    auth = {"Authorization": f"Bearer {admin_caller.token}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app, headers=auth)
    failures, ran = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                                 suppress_health_check=list(hypothesis.HealthCheck),
                                 phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                case.call_and_validate(headers=auth, checks=CHECKS)

            try:
                run()
            except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, not only the first
                failures.append(f"{operation.label} ({mode.value}): {exc}"[:2000])
            ran += 1
    assert ran >= 40
    assert not failures, "\n\n".join(failures)
