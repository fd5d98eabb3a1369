"""The event-log record as Spark reads it, and the columns of the aggregates it writes.

The record's fields are docs/design.md's ("The event log") and
proxy/observability/receive_event.py's ``ReceiveEvent``, in order; tests/analytics/
test_schema.py holds them to the proxy's Parquet columns too. An explicit schema skips
inference (a full extra pass over the input) and never silently changes a column's type:
a line that does not parse reads as nulls, a value that does not fit its field as a null
in that field, and either way a required field is missing, so the line counts as
malformed. (Spark's corrupt-record column would say the same at the price of every line's
text: a third more than a plain read of the log, measured on the benchmark's records.)
"""

from __future__ import annotations

from pyspark.sql import types as T

# Partition columns of the log layout <dir>/proxy=<id>/date=<YYYY-MM-DD>/. ``proxy`` is also a
# field of the record; ``date`` is only in the path. Both are strings here: left to
# inference, Spark would turn the date into a DateType and a numeric proxy id into an int.
PARTITION_DATE = "date"

EVENT_FIELDS: tuple[tuple[str, T.DataType], ...] = (
    ("ts", T.LongType()),
    ("proxy", T.StringType()),
    ("group", T.StringType()),
    ("topic", T.StringType()),
    ("mode", T.StringType()),
    ("is_long_polling", T.BooleanType()),
    ("is_short_polling_hit", T.BooleanType()),
    ("polling_ms", T.LongType()),
    ("wait_ms", T.LongType()),
    ("messages", T.LongType()),
    ("result", T.StringType()),
    ("pops", T.LongType()),
    ("notifications", T.LongType()),
    ("broker", T.StringType()),
)

# Every field but ``broker`` (null when nothing was delivered) must be present: a line
# without one of them cannot be counted in any aggregate and is reported as malformed.
REQUIRED_FIELDS = tuple(name for name, _ in EVENT_FIELDS if name != "broker")

EVENT_SCHEMA = T.StructType(
    [T.StructField(name, dtype, nullable=True) for name, dtype in EVENT_FIELDS]
    + [
        T.StructField(PARTITION_DATE, T.StringType(), nullable=True),
    ]
)

# The aggregates: one row per window, proxy (or the fleet), group, topic and mode.
FLEET = "_fleet"
GROUP_KEYS = ("proxy", "group", "topic", "mode")
ROW_KEY = ("window_start", *GROUP_KEYS)
# Wait-time quantile (as the Pushgateway label spells it) -> column of the aggregates.
WAIT_COLUMNS = {"0.5": "wait_p50_ms", "0.9": "wait_p90_ms", "0.99": "wait_p99_ms"}
# The wait times' KLL sketch (binary, DataSketches' KllLongsSketch), stored beside the
# quantiles read from it: rows merge into wider ones (the fleet, a day) without the records.
WAIT_SKETCH = "wait_sketch"
