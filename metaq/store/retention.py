"""Retention: MetaQ's ``deletePolicy``, what to remove and how.

``deletePolicy``: ``delete,N`` or ``archive,N[,true]`` where N takes an optional unit
``s``, ``m`` or ``h`` (hours if none). Archive renames the segment to ``.arc``, or zips
it to ``.zip`` with the third field ``true``. Only read-only (closed) segments whose
mtime is older than N are touched, oldest first, so the log stays contiguous
(``PartitionLog.detach_segments_older_than``). When to look is ``deleteWhen``
(``metaq.cron``); the pass itself is ``MessageStoreManager.run_retention``. Both settings are
parsed by modules of the configuration's layer (``metaq/delete_policy.py``, ``metaq/cron.py``),
so the file's check and this pass read them alike.

Which time: a segment's age is its file's mtime (when it was last written), as in MetaQ, not
the times in its time index: a record's time is its msg id's logical clock, which may run
ahead of the wall clock, and a slave's copy must age as its master's does. A detached
segment's time index file goes with it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from metaq.delete_policy import DeletePolicy, parse_delete_policy  # noqa: F401 (the store's names for them)
from metaq.private_files import fsync_directory, private_opener
from metaq.store.segment import LogSegment

# --- disposing of detached segments ----------------------------------------------------


def archive_segment_file(segment: LogSegment, compress: bool) -> Path:
    """Rename ``{start}.meta`` to ``{start}.arc``, or zip it into ``{start}.zip``.

    The new name no longer matches ``*.meta``, so the log ignores it from then on.
    """
    segment.close()
    segment.time_index.remove()  # an archived segment is out of the log: no lookup reads it
    source = segment.path
    if not compress:
        target = source.with_suffix(".arc")
        os.replace(source, target)
    else:
        target = source.with_suffix(".zip")
        partial = target.with_name(target.name + ".partial")
        # Write under a temporary name and rename, so a crash never leaves a
        # half-written zip that looks complete, and the .meta goes only afterwards.
        # strict_timestamps=False: a file with an mtime before 1980 (bad clock) still archives.
        with open(partial, "w+b", opener=private_opener) as handle:
            with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED, strict_timestamps=False) as archive:
                archive.write(source, arcname=source.name)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
        source.unlink()
    fsync_directory(source.parent)
    return target


def delete_segment_file(segment: LogSegment) -> Path:
    """Delete a detached segment's file; returns the removed path."""
    segment.close()
    segment.time_index.remove()
    segment.path.unlink(missing_ok=True)
    fsync_directory(segment.path.parent)
    return segment.path


def dispose_segment(segment: LogSegment, policy: DeletePolicy) -> Path:
    """Delete or archive a segment that retention detached from its log."""
    if policy.kind == "delete":
        return delete_segment_file(segment)
    return archive_segment_file(segment, policy.zip)
