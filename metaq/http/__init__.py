"""HTTP access to a metaq cluster: the ``metaq http`` gateway (docs/http.md).

``errors`` (HttpError), ``bodies`` (JSON and raw request/response bodies, input checks),
``gateway`` (produce, fetch, list through the real client), ``app`` (aiohttp routes).
"""
