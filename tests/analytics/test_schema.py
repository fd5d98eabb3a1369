"""The event log's schema is one: the proxy's Parquet columns, its ``ReceiveEvent`` fields and
the job's Spark schema name the same fields, in the same order, with matching types."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
from pyspark.sql import types as T

from polling_report.schema import EVENT_FIELDS
from proxy.observability.eventlog_parquet import EVENT_SCHEMA
from proxy.observability.receive_event import ReceiveEvent

SPARK_TYPE = {pa.int64(): T.LongType(), pa.string(): T.StringType(), pa.bool_(): T.BooleanType()}


def test_the_proxy_and_the_job_share_the_records_schema():
    fields = [f.name for f in dataclasses.fields(ReceiveEvent)]
    assert [f.name for f in EVENT_SCHEMA] == fields
    assert [name for name, _ in EVENT_FIELDS] == fields
    assert [SPARK_TYPE[f.type] for f in EVENT_SCHEMA] == [kind for _, kind in EVENT_FIELDS]
    # Only the broker may be missing: the job counts a record without another field as
    # malformed, and a Parquet file never holds one.
    assert [f.name for f in EVENT_SCHEMA if f.nullable] == ["broker"]
