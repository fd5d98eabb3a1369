"""The remoting port: RocketMQ's own protocol for the clients that speak it (``port``),
each client's connections to the brokers (``session``), where each request goes
(``routing``), and its pulls and pops as receive records (``records``)."""
