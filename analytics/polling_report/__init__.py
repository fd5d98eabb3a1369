"""Polling analytics: the PySpark job over the proxies' event logs (``rmq-polling-report``).

pyspark is imported only inside this package and only by the modules that need it, so the
proxy itself never depends on it (it comes with the ``analytics`` extra). The pure parts
(durations, the recommendation rule, the report text, the Pushgateway gauges) import no
Spark at all and are tested without a JVM.
"""
