"""Probing shared by a fleet of proxies: one prober per (group, topic) key.

Without it every proxy that holds a poll of a key parks a NOTIFICATION for it on every
broker, so a broker holds K · P_k of them (docs/scale.md). With it, the proxies agree on
one owner per key by rendezvous hashing over the live members (``members.py``); the owner
probes for the key on behalf of every proxy that has a poll of it waiting, and tells the
one that waited longest when a broker has a message (``proxy/receive/shared.py``). The
messages between proxies (``messages.py``, over ``links.py``) are hints: every delivery
still goes through the woken proxy's own pop and its client's ack, so a lost hint costs
latency, never a message.
"""
