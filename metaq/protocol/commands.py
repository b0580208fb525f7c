"""Commands of the metaq protocol: the table of requests and replies, and their names in one place.

The typed messages live in messages.py, the result codes in codes.py; handlers use them
through this module (``from ..protocol import commands as c``).

Every request header has ``op`` and ``opaque``; the reply echoes ``opaque`` and
carries ``code`` (MetaQ's HTTP-like result codes) and, on errors, ``msg``.

    op         request fields (besides op, opaque)                  body            reply
    ---------  ---------------------------------------------------  --------------  -------------------------------------------
    put        topic, partition (-1 = broker picks), [count],       records         200 partition offset msg_id count end_offset epoch
               [producer_id, producer_epoch, sequence,                              [duplicate] (a retry of a stored batch)
               producer_token], [txid]
    init_producer  [transactional_id]                               -               200 producer_id epoch [producer_token]
    get        topic, partition, offset, max_size, [group],         -               200 offset committed log_end + log bytes;
               [max_wait_ms], [replica: {slave_id, epoch, log_end}]                 301 offset (moved); 404 (no data yet)
    offset     topic, partition, offset                             -               200 offset min_offset max_offset
    offset_for_time  topic, partition, time_ms                      -               200 offset latest min_offset max_offset
                                                                                    (the first offset whose record time
                                                                                    is >= time_ms; latest: none is, offset
                                                                                    = max_offset)
    stats      [item], [format: "text" | "map"]                         -               200 + text body, or with format
                                                                                    "map": a msgpack [[name, value], ...] body
    version    -                                                    -               200 version
    quit       -                                                    -               (connection closed)
    config     -                                                    -               200 checksum + server.ini bytes
    topics     -                                                    -               200 topics {name: numParts} role epoch
    epoch_end  topic, partition, epoch                              -               200 epoch end_offset (largest epoch <= the
                                                                                        asked one, and where it ends in this log)
                                                                                        role serving_epoch; 403 reason not_master
                                                                                        (only the acting master answers)
    epochs     topic, partition                                     -               200 entries [[epoch, start_offset], ...]
                                                                                        role serving_epoch
    checksum   topic, partition, start, end                         -               200 start end crc (CRC32 of the log bytes
                                                                                        in [start, end), end clamped to log end)
    position   topic, partition, replica: {slave_id, epoch,         -               200 committed log_end epoch
               log_end}
    news       replica: {slave_id, epoch}, [max_wait_ms]          quiet partitions 200 epoch + msgpack [[topic, partition], ...]
                                                                    (msgpack)       of those with news (parked until one has)
    stream     topic, partition, replica: {slave_id, epoch,          -               200 (subscribed; then one frame per put
               log_end}                                                             with this opaque: a chunk, see
                                                                                    replication_stream.py); 503 closes it
    stream_ack -                                                    report (16 B)   none (one-way; a refused one is logged)
    transaction  action, [xid], [timeout_s], [producer_id,          -               200 xa_code [xids (recover)]
               producer_epoch, producer_token]
    auth       mechanism, step, data (metaq/security/messages.py)   -               200 step data [principal]; 403
                                                                                    (security on: the SCRAM handshake)

What each command needs of its sender (security on) is declared by its class in
messages.py (``OPERATION``, ``access``) and decided by metaq/server/authz.py.

``get`` with a ``replica`` field is a slave's fetch: it reads past the committed
offset (up to the log end) and reports the slave's progress to the master.
``position`` reports that progress alone: a slave of a sync master sends it while it
appends a large fetch reply piece by piece, so the puts in the first pieces are acked
without waiting for the whole reply to be checked and written.
``news`` is a slave's one long-poll for every partition it has no fetch parked on
(metaq/ha/news.py): a slave's cost on its master does not grow with idle partitions.
"""

from __future__ import annotations

from .codes import (  # noqa: F401  (the protocol's names, one import away for handlers)
    ACCESS_DENIED,
    BAD_REQUEST,
    CODE_NAMES,
    FORBIDDEN,
    GATEWAY_TIMEOUT,
    INTERNAL_ERROR,
    MOVED,
    NOT_FOUND,
    OK,
    REASON_FIELD,
    RETRIABLE_CODES,
    SERVICE_UNAVAILABLE,
    UNKNOWN_OUTCOME_CODES,
    AccessDenied,
    RequestError,
    reply_header,
)
from .messages import TEXT_COMMANDS, Origin, Request, parse_request, text_request  # noqa: F401
