"""docs/client.md: `Message(topic, data, attribute=None)`; a bad field is refused where the
message is made, naming the field, not later inside a send."""

from __future__ import annotations

import enum

import pytest

from metaq.client import Message


@pytest.mark.parametrize(("args", "kwargs", "named"), [
    (("orders", "text"), {}, "data must be bytes, not str"),
    (("", b"x"), {}, "topic must be a non-empty str"),
    ((None, b"x"), {}, "topic must be a non-empty str"),
    ((b"orders", b"x"), {}, "topic must be a non-empty str"),
    (("orders", b"x"), {"attribute": 5}, "attribute must be a str or None, got int 5"),
    (("orders", b"x"), {"attribute": b"eu"}, "attribute must be a str or None, got bytes"),
])
def test_a_bad_field_is_a_type_error_naming_it(args: tuple, kwargs: dict, named: str) -> None:
    with pytest.raises(TypeError, match=named):
        Message(*args, **kwargs)


def test_plain_values_and_str_subclasses_are_taken() -> None:
    class Region(str, enum.Enum):
        EU = "eu"

    message = Message("orders", bytearray(b"x"), attribute=Region.EU)
    assert message == ("orders", b"x", "eu", None, None, None)
    assert type(message.attribute) is str and type(message.data) is bytes
    assert Message("orders", b"x").attribute is None

