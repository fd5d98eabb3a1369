"""The official RocketMQ 5 clients as test peers: ``harness`` starts the proxy and each
client's driver process (``python_client.py`` under ``.venv-interop``, ``node/client.mjs``,
and the Java driver built from ``rocketmq_local/java-client``); ``scenarios`` is what each
client is held to, written once for all of them."""
