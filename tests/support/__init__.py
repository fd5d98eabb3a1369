"""Helpers every test tier shares (the bounded waits are testkit.waits, shared with the
benchmarks' tests): draining pops and scripted remoting peers (brokers.py, scripted.py),
raw remoting request fields (remoting.py), Prometheus samples (metrics.py), free ports
(ports.py), a throw-away CA (tls_ca.py) and a signing gRPC client (secure_client.py).
Fixtures stay in the conftest files."""
