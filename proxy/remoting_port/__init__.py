"""The remoting port: RocketMQ's own protocol for the clients that speak it (``port``),
each client's connections to the brokers (``session``), and where each request goes
(``routing``)."""
