"""Policy between the gRPC front and the brokers: where a send goes and where it retries
(``producer``), how acks, invisible-time changes, hand-backs and dead letters reach each
broker (``consumer``). The RPC activities in ``proxy/api`` and the receive engine both
call down into these; nothing here knows gRPC."""
