"""The bounded path: sessions of data that is all there, by sort and scan.

No store, no watermark, no lateness: keys are encoded, rows ordered by (key, time), session
boundaries found by the gap rule (dynamic gaps and maximum duration included), and the
aggregations reduced per session in columns. Inputs larger than the memory limit are
hash-partitioned by key into spill files. See ``docs/static.md``.
"""

from .api import Stats, run, sessionize

__all__ = ["Stats", "run", "sessionize"]
