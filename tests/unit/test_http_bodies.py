"""The HTTP layer's pure parts: request bodies, reply mapping, and the 301 redirect (stub gateway)."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp.test_utils import TestClient, TestServer

from metaq.client.message import Message, Partition, SendResult
from metaq.http.app import build_app
from metaq.http.bodies import message_json, messages_from_json, produce_status, send_result_json
from metaq.http.errors import HttpError
from metaq.http.gateway import _record_size, _whole_record


def test_messages_from_json_accepts_text_base64_attribute_and_a_single_object() -> None:
    many = messages_from_json("t", {"messages": [{"data": "é"}, {"data_base64": base64.b64encode(b"\x00\xff").decode(), "attribute": "a"}]}, 100)
    assert [(m.topic, m.data, m.attribute) for m in many] == [("t", "é".encode(), None), ("t", b"\x00\xff", "a")]
    (one,) = messages_from_json("t", {"data": "x"}, 100)
    assert one.data == b"x"


@pytest.mark.parametrize("body, status, reason", [
    ([], 400, "must be an object"),
    ({"messages": []}, 400, "non-empty list"),
    ({"messages": ["x"]}, 400, "message 0: must be an object"),
    ({"data": "x", "data_base64": "eA=="}, 400, "exactly one of"),
    ({"attribute": "a"}, 400, "exactly one of"),
    ({"data": 5}, 400, "must be a string"),
    ({"data": "x", "attribute": 5}, 400, "attribute"),
    ({"data_base64": "not base64!"}, 400, "not valid base64"),
    ({"data": "x", "key": "k"}, 400, "unknown field(s) key"),
    ({"messages": [{"data": "ok"}, {"data": "x" * 11}]}, 413, "message 1: 11 bytes exceeds the maximum message size of 10"),
    ({"data": "x" * 4, "attribute": "abc"}, 413, "11 bytes"),  # the attribute block counts: 4 + 3 + 4
])
def test_bad_message_bodies(body, status, reason) -> None:
    with pytest.raises(HttpError) as caught:
        messages_from_json("t", body, 10)
    assert caught.value.status == status and reason in caught.value.reason


def test_produce_status_is_the_worst_failure_class() -> None:
    ok = SendResult(True, Partition(0, 1), 10, 99)
    not_stored = SendResult(False, error_message="no master", code=503)
    unknown = SendResult(False, error_message="timeout", outcome_unknown=True)
    assert produce_status([ok, ok]) == 200
    assert produce_status([ok, not_stored]) == 503
    assert produce_status([ok, SendResult(False, code=None)]) == 503
    assert produce_status([not_stored, SendResult(False, code=400)]) == 400
    assert produce_status([SendResult(False, code=500)]) == 502
    assert produce_status([SendResult(False, code=400), unknown]) == 504
    assert send_result_json(ok) == {"success": True, "partition": "0-1", "offset": 10, "msg_id": 99}
    assert send_result_json(unknown)["failure"] == "outcome_unknown"
    assert send_result_json(not_stored) == {"success": False, "failure": "not_stored", "code": 503, "error": "no master"}


def test_message_json_gives_text_only_where_it_is_utf8() -> None:
    text = Message("t", "é".encode(), "a", 7, Partition(0, 0), 40)
    assert message_json(text, 62, "utf-8") == {"offset": 40, "next_offset": 62, "msg_id": 7, "attribute": "a", "data": "é"}
    assert message_json(text, 62, "base64")["data_base64"] == base64.b64encode("é".encode()).decode()
    assert "data_base64" in message_json(Message("t", b"\xff"), 0, "utf-8")


def test_reasons_are_one_line() -> None:
    assert HttpError(400, "bad\nthing  here").reason == "bad thing here"


def test_record_size_reads_the_header_length() -> None:
    header = (5).to_bytes(4, "big") + bytes(16)
    assert _record_size(header) == 25 and not _whole_record(header)
    assert _whole_record(header + b"12345")
    assert _record_size(b"\xff\xff\xff\xff") is None and _record_size(b"ab") is None


class _MovedGateway:
    max_message_size = 100

    async def fetch(self, topic, partition, offset, max_bytes, wait_ms, read_from):
        raise HttpError(301, f"offset {offset} is before the log start", offset=4096)

    async def topic_names(self):
        raise RuntimeError("a bug\nover two lines")


def test_moved_is_a_301_to_the_same_request_at_the_new_offset() -> None:
    async def scenario():
        async with TestClient(TestServer(build_app(_MovedGateway()))) as client:  # type: ignore[arg-type]
            response = await client.get("/topics/t/partitions/0-1/messages?offset=0&wait_ms=100", allow_redirects=False)
            return response.status, response.headers["Location"], await response.json()

    status, location, body = asyncio.run(scenario())
    assert status == 301
    assert location == "/topics/t/partitions/0-1/messages?offset=4096&wait_ms=100"
    assert body == {"error": "offset 0 is before the log start", "offset": 4096}


def test_openapi_document_matches_the_routes() -> None:
    import yaml

    from tests.harness import REPO_ROOT

    document = yaml.safe_load((REPO_ROOT / "docs" / "http-openapi.yaml").read_text())
    documented = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops if method != "parameters"}
    served = {(r.method, r.resource.canonical) for r in build_app(_MovedGateway()).router.routes() if r.method != "HEAD"}  # type: ignore[arg-type]
    assert documented == served

    def refs(node):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from [value] if key == "$ref" else refs(value)
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    for ref in refs(document):
        target = document
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]  # KeyError: a dangling $ref


def test_a_body_over_the_request_limit_is_413() -> None:
    async def scenario():
        async with TestClient(TestServer(build_app(_MovedGateway(), max_request_bytes=1000))) as client:  # type: ignore[arg-type]
            response = await client.post("/topics/t/messages", data=b"x" * 2000, headers={"Content-Type": "application/octet-stream"})
            return response.status, await response.json()

    assert asyncio.run(scenario()) == (413, {"error": "request body larger than 1000 bytes"})


def test_an_unexpected_error_is_a_500_with_one_line() -> None:
    async def scenario():
        async with TestClient(TestServer(build_app(_MovedGateway()))) as client:  # type: ignore[arg-type]
            response = await client.get("/topics")
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    assert status == 500 and body["error"] == "internal error: RuntimeError: a bug over two lines"
