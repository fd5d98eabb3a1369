"""Security of the proxy: TLS on its ports, authentication and authorization of the clients,
and signed requests to ACL-enabled brokers (docs/security.md).

- ``config``: ``SecurityConfig``, the ``[security]`` table of the proxy's configuration.
- ``signing``: the clients' ACL 2.0 signature (``authorization`` / ``x-mq-date-time``) and the
  remoting ACL hook's signature (``AccessKey`` / ``Signature``).
- ``users``: the operator's user file: credentials and each user's permissions.
- ``guard``: the one place an RPC is authenticated and authorized.
- ``tls``: server certificates, reloaded when their files change or on SIGHUP.

Everything is off by default: with no ``[security]`` settings the proxy serves as before.
"""
