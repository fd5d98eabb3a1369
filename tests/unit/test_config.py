from __future__ import annotations

import pytest

from proxy.config import load


def test_defaults():
    config = load(env={})
    assert (config.grpc_port, config.http_port) == (8081, 8082)
    assert config.receive.mode == "adaptive"
    assert (config.receive.min_polling_ms, config.receive.max_polling_ms) == (5000, 20000)


def test_file_then_environment_then_flags(tmp_path):
    path = tmp_path / "proxy.toml"
    path.write_text(
        'grpc_port = 9000\nnamesrv_addrs = ["10.0.0.1:9876"]\n'
        '[receive]\nmode = "notify"\nmax_in_flight = 10\nslice_ms = 50\n'
    )
    config = load(str(path), env={})
    assert config.grpc_port == 9000 and config.namesrv_addrs == ["10.0.0.1:9876"]
    assert (config.receive.mode, config.receive.max_in_flight) == ("notify", 10)
    env = {
        "RMQ_PROXY_GRPC_PORT": "9100",
        "RMQ_PROXY_RECEIVE_MODE": "coupled",
        "RMQ_PROXY_NAMESRV_ADDRS": "a:1,b:2",
    }
    config = load(str(path), env=env)
    assert config.grpc_port == 9100 and config.receive.mode == "coupled"
    assert config.namesrv_addrs == ["a:1", "b:2"]
    config = load(str(path), env=env, grpc_port=9200, receive_mode="slicing", http_port=None)
    assert config.grpc_port == 9200 and config.receive.mode == "slicing"
    assert config.http_port == 8082  # None leaves the setting alone


def test_limits_from_file_and_environment(tmp_path):
    path = tmp_path / "proxy.toml"
    path.write_text("[limits]\nmax_message_group_size = 128\nmax_user_property_count = 64\n")
    config = load(str(path), env={"RMQ_PROXY_LIMITS_MAX_USER_PROPERTY_COUNT": "32"})
    assert config.limits.max_message_group_size == 128
    assert config.limits.max_user_property_count == 32
    assert config.limits.max_user_property_size == 16 * 1024  # the Apache proxy's default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nonsense = 1\n", "unknown setting"),
        ('[receive]\nmode = "fast"\n', "receive.mode"),
        ("[receive]\nmin_polling_ms = 30000\n", "polling bounds"),
        ('[fleet]\npeers = ["proxy-2"]\n', "fleet.peers"),
        ('workers = 2\n[fleet]\npeers = ["p1:8083", "p2:8083"]\n', "workers = 1"),
        ("[fleet]\nfallback_ms = 0\n", "fleet.fallback_ms"),
        ("grpc_max_connection_age_s = -1\n", "grpc_max_connection_age_s"),
        ("[limits]\nmax_delay_ms = -1\n", "limits must not be negative"),
        ("[limits]\nmax_invisible_ms = 5000\n", "max_invisible_ms"),
        ('[client_metrics]\nmode = "on"\n', "client_metrics.mode must be one of"),
        ('[client_metrics]\nmode = "collector"\n', "needs client_metrics.collector"),
        ('[client_metrics]\nforward_to = "collector"\n', "is not host:port"),
        ("[client_metrics]\nmax_label_sets = 0\n", "must be positive"),
        ("remoting_broker_ports = { broker-a = 9001 }\n", "needs remoting_port"),
        ("remoting_port = 0\nremoting_broker_ports = { broker-a = 70000 }\n", "port number"),
        ("remoting_port = 9001\nremoting_broker_ports = { broker-a = 9001 }\n", "of its own"),
        ("remoting_port = 0\nremoting_broker_ports = { a = 9002, b = 9002 }\n", "of its own"),
        ('remoting_broker_advertise_addresses = { a = "h:1" }\n', "no remoting_broker_ports"),
        (
            "remoting_port = 0\nremoting_broker_ports = { a = 0 }\n"
            'remoting_broker_advertise_addresses = { a = "h" }\n',
            "needs host:port",
        ),
    ],
)
def test_bad_configuration_is_refused_with_a_reason(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load(str(path), env={})


def test_broker_ports_from_the_file_the_environment_and_flags(tmp_path):
    from proxy.config import parse_port_map

    path = tmp_path / "proxy.toml"
    path.write_text('remoting_port = 8080\nremoting_broker_ports = { "broker-a" = 8091 }\n')
    assert load(str(path), env={}).remoting_broker_ports == {"broker-a": 8091}
    env = {"RMQ_PROXY_REMOTING_BROKER_PORTS": "broker-a=8093, broker-b=8094"}
    config = load(str(path), env=env)
    assert config.remoting_broker_ports == {"broker-a": 8093, "broker-b": 8094}
    flags = parse_port_map(["broker-c=0"])  # --remoting-broker-port broker-c=0
    assert load(str(path), env=env, remoting_broker_ports=flags).remoting_broker_ports == flags
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_port_map(["broker-a:8091"])
    with pytest.raises(ValueError, match="NAME=PORT"):
        parse_port_map(["broker-a=lb:8091"])
    env["RMQ_PROXY_REMOTING_BROKER_ADVERTISE_ADDRESSES"] = "broker-b=lb:18094"
    config = load(str(path), env=env)
    assert config.remoting_broker_advertise_addresses == {"broker-b": "lb:18094"}


def test_the_example_file_lists_every_setting_with_its_default():
    from pathlib import Path

    example_path = Path(__file__).parents[2] / "deploy" / "proxy.example.toml"
    example = load(str(example_path), env={})
    defaults = load(env={})
    example.proxy_id = defaults.proxy_id
    assert example == defaults
    text = example_path.read_text()
    import dataclasses

    from proxy.config import ClientMetricsConfig, LimitsConfig, ProxyConfig, ReceiveConfig

    fields = [*dataclasses.fields(ProxyConfig), *dataclasses.fields(ReceiveConfig)]
    fields += dataclasses.fields(ClientMetricsConfig)
    for f in [*fields, *dataclasses.fields(LimitsConfig)]:
        if f.name != "receive":
            assert f.name in text, f"{f.name} missing from the example"


def test_client_metrics_from_the_file_and_the_environment(tmp_path):
    from proxy.config import ClientMetricsMode

    path = tmp_path / "proxy.toml"
    path.write_text('[client_metrics]\nmode = "collector"\ncollector = "otel:4317"\n')
    config = load(str(path), env={"RMQ_PROXY_CLIENT_METRICS_MAX_LABEL_SETS": "7"})
    assert config.client_metrics.mode is ClientMetricsMode.COLLECTOR
    assert config.client_metrics.collector == "otel:4317"
    assert config.client_metrics.max_label_sets == 7
    assert load(env={}).client_metrics.mode is ClientMetricsMode.OFF  # the default
    env = {"RMQ_PROXY_CLIENT_METRICS_MODE": "proxy"}
    assert load(env=env).client_metrics.mode is ClientMetricsMode.PROXY
