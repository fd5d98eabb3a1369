"""What the test suite and the benchmarks both drive the proxy with.

- ``lean_client``: a small asyncio client of the proxy's gRPC API (the calls the official
  SimpleConsumer and Producer make), for tests and load.
- ``processes``: name servers, brokers and proxies as processes on loopback, stopped by pid.
- ``official``: the official RocketMQ 5 clients (Python, Node.js, Java) as driver processes,
  and the scenarios every one of them is held to.
- ``spark_cluster``: a Spark standalone cluster on loopback for the analytics job.
- ``waits``: bounded waits on a condition, instead of sleeps.
- ``balancer``: a TCP balancer that follows the proxies' readiness, as a Kubernetes Service.

``tests/`` and ``bench/`` import from here and never from each other; the benchmarks' own
tests are in ``bench/tests``.
"""
