"""Observability: Prometheus metrics, the receive event log and the ops HTTP server."""

from proxy.observability.eventlog import EventLog, ReceiveEvent
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.ops import OpsServer

__all__ = ["EventLog", "OpsServer", "ProxyMetrics", "ReceiveEvent"]
