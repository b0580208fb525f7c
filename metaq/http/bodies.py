"""Request and response bodies of the HTTP API: parsing with one-line errors, and rendering.

A message in JSON carries its bytes either as ``"data"`` (a UTF-8 string, stored as its
UTF-8 bytes) or as ``"data_base64"`` (standard base64), never both; ``"attribute"`` is
an optional string. Raw bodies (``application/octet-stream``) are one message's bytes.
Every check here runs before anything is sent, so bad input stores nothing.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ..client.message import Message, Partition, SendResult
from ..record import payload_size
from .errors import HttpError

ENCODINGS = ("base64", "utf-8")


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"malformed JSON: {exc}") from None


def messages_from_json(topic: str, body: Any, max_message_size: int) -> list[Message]:
    """``{"messages": [m, ...]}`` or a single message object ``m``, as Messages."""
    if not isinstance(body, dict):
        raise HttpError(400, "the JSON body must be an object: a message or {\"messages\": [...]}")
    items = body["messages"] if "messages" in body else [body]
    if not isinstance(items, list) or not items:
        raise HttpError(400, "\"messages\" must be a non-empty list")
    return [_message(topic, item, i, max_message_size) for i, item in enumerate(items)]


def _message(topic: str, item: Any, index: int, max_message_size: int) -> Message:
    where = f"message {index}"
    if not isinstance(item, dict):
        raise HttpError(400, f"{where}: must be an object")
    unknown = set(item) - {"data", "data_base64", "attribute"}
    if unknown:
        raise HttpError(400, f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    if ("data" in item) == ("data_base64" in item):
        raise HttpError(400, f"{where}: needs exactly one of \"data\" (text) or \"data_base64\"")
    attribute = item.get("attribute")
    if attribute is not None and not isinstance(attribute, str):
        raise HttpError(400, f"{where}: \"attribute\" must be a string")
    if attribute is not None:
        _utf8(attribute, where, "attribute")
    if "data" in item:
        if not isinstance(item["data"], str):
            raise HttpError(400, f"{where}: \"data\" must be a string (use \"data_base64\" for bytes)")
        data = _utf8(item["data"], where, "data")
    else:
        if not isinstance(item["data_base64"], str):
            raise HttpError(400, f"{where}: \"data_base64\" must be a base64 string")
        try:
            data = base64.b64decode(item["data_base64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise HttpError(400, f"{where}: \"data_base64\" is not valid base64: {exc}") from None
    return checked_message(Message(topic, data, attribute), where, max_message_size)


def _utf8(text: str, where: str, field: str) -> bytes:
    """``text`` as UTF-8; JSON's ``\\ud800`` escapes decode to lone surrogates, which have none: 400, not 500."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise HttpError(400, f"{where}: \"{field}\" is not valid Unicode text (a lone surrogate escape)") from None


def checked_message(message: Message, where: str, max_message_size: int) -> Message:
    """The broker's size rule (payload = attribute block + data), checked before sending."""
    size = payload_size(message.attribute, message.data)
    if size > max_message_size:
        raise HttpError(413, f"{where}: {size} bytes exceeds the maximum message size of {max_message_size} bytes")
    return message


def send_result_json(result: SendResult) -> dict[str, Any]:
    """A SendResult as JSON: where it was stored, or why not (``failure``: the class)."""
    if result.success:
        return {"success": True, "partition": str(result.partition), "offset": result.offset, "msg_id": result.msg_id}
    return {
        "success": False,
        "failure": "outcome_unknown" if result.outcome_unknown else "not_stored",
        "code": result.code,
        "error": result.error_message,
    }


def produce_status(results: list[SendResult]) -> int:
    """The HTTP status of a produce reply: 200 when all were stored, else the worst failure's.

    504 when some outcome is unknown (resending may duplicate), 400/404 for a request
    the broker refused as wrong, 502 for a broker's internal error, 503 when the
    brokers could not take it in time (retriable: nothing was stored).
    """
    failed = [r for r in results if not r.success]
    if not failed:
        return 200
    if any(r.outcome_unknown for r in failed):
        return 504
    codes = {r.code for r in failed}
    for code in (400, 404):
        if code in codes:
            return code
    return 502 if 500 in codes else 503


def message_json(message: Message, end: int, encoding: str) -> dict[str, Any]:
    out: dict[str, Any] = {"offset": message.offset, "next_offset": end, "msg_id": message.id, "attribute": message.attribute}
    return {**out, **data_json(message.data, text=encoding == "utf-8")}


def data_json(data: bytes, text: bool = True) -> dict[str, str]:
    """A message's bytes in JSON, exactly: ``{"data": str}`` where they are UTF-8 (and ``text``),
    else ``{"data_base64": str}``; never a lossy decode (the HTTP API and ``metaq topics get --json``)."""
    if text:
        try:
            return {"data": data.decode("utf-8")}
        except UnicodeDecodeError:
            pass  # not text: given as base64, as the field name says
    return {"data_base64": base64.b64encode(data).decode("ascii")}


def parse_partition(name: str) -> Partition:
    try:
        return Partition.parse(name)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None


def int_param(params: Any, name: str, default: int | None, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        if default is None:
            raise HttpError(400, f"missing query parameter {name!r}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise HttpError(400, f"{name} must be between {low} and {high}, got {value}")
    return value


def choice_param(params: Any, name: str, choices: tuple[str, ...], default: str) -> str:
    value = params.get(name, default)
    if value not in choices:
        raise HttpError(400, f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value
