"""The compiled part of metaq-py: optional, everything else is in pyproject.toml.

``metaq._speedups`` decodes fetched records into Messages in C (the consumer's
hot path), and validates, walks and stamps record batches in C (the broker's put and a
slave's append, through ``metaq.record``). ``optional=True``: without a C compiler,
Python's headers or zlib's, the install goes on and ``metaq.client.codec`` and
``metaq.record`` use their pure-Python code instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("metaq._speedups", ["metaq/_speedups.c"], libraries=["z"], optional=True)])
