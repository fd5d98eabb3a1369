"""Helpers every test tier shares: bounded waits, async and sync (waits.py), draining pops
and scripted remoting peers (brokers.py, scripted.py), raw remoting request fields
(remoting.py), Prometheus samples (metrics.py), free ports (ports.py), a throw-away CA
(tls_ca.py) and a signing gRPC client (secure_client.py). Fixtures stay in the conftest
files."""
