"""The server answers as its OpenAPI document says: schemathesis generates requests from
/openapi.json, valid and invalid, for every operation, sends them to a real server on loopback
and checks each answer's status, content type, headers and body against the document (and
that invalid ones are refused, and none gets a 5xx). A bounded number of examples per
operation keeps it to a minute."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.allow_header_conformance,
]


@pytest.fixture(scope="module")
def api(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_the_documented_one(case, server):
    case.call_and_validate(base_url=server.url, checks=CHECKS)


def test_the_document_lists_what_the_server_answers(server):
    doc = httpx.get(f"{server.url}/openapi.json").json()
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert "422" not in completions and {"400", "401", "404", "413", "415", "503"} <= set(completions)
    assert completions["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert set(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert doc["paths"]["/health"]["get"]["responses"]["200"]["content"] == {}


def test_a_wrong_method_gets_405_with_allow(server):
    response = httpx.get(f"{server.url}/v1/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["error"]["type"] == "invalid_request_error"
