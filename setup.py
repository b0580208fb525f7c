"""The compiled part of metaq-py: optional, everything else is in pyproject.toml.

``metaq._speedups`` (``metaq/_speedups.c``) runs in C: the decode of fetched records into
Messages (the consumer's hot path, ``metaq.client.codec``); the validation, walk and id
stamping of record batches (the broker's put and a slave's append, ``metaq.record``); and
the request path of both sides: a whole frame out of the receive buffer and its msgpack
header, a frame packed (``metaq.protocol.frames``), a request's fields checked and the
request built (``metaq.protocol.messages.parse_request``). ``optional=True``: without a C
compiler, Python's headers or zlib's, the install goes on and each of those modules uses
its pure-Python code instead (the unit tests run both).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("metaq._speedups", ["metaq/_speedups.c"], libraries=["z"], optional=True)])
