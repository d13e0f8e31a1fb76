"""Schemathesis over the served OpenAPI schema: whatever it sends, the server never answers 5xx.

Admin and job routes are left out (a generated policy must not change the shared server's classes, a
generated job must not index the server's disks), and so is the endless stats stream. Requests come
from user "fuzz", whose default class answers with one token, and the coverage phase is off: every
valid generation request runs the model on a slow CPU.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.slow
CONFIG = {"phases": {"coverage": {"enabled": False}}}


@pytest.fixture(scope="session")
def api_schema(server_url: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{server_url}/schema/openapi.json",
                                         config=schemathesis.Config.from_dict(CONFIG))


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=r"^/(admin|v1/stats/stream|v1/jobs)")


@schema.parametrize()
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"X-HomeAI-User": "fuzz"}, checks=[not_a_server_error], timeout=60)
