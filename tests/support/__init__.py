"""Helpers every test tier shares: bounded waits (waits.py), draining pops and scripted
remoting peers (brokers.py), free ports (ports.py), a throw-away CA (tls_ca.py) and a
signing gRPC client (secure_client.py). Fixtures stay in the conftest files."""
