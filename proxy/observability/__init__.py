"""Observability: Prometheus metrics, the receive event log and the ops HTTP server."""

from proxy.observability.eventlog import EventLog
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.ops import OpsServer
from proxy.observability.receive_event import ReceiveEvent

__all__ = ["EventLog", "OpsServer", "ProxyMetrics", "ReceiveEvent"]
