"""The pieces of ``--workers N`` that need no processes: the setting, the configuration a
worker receives, the reserved port."""

from __future__ import annotations

import socket

import pytest

from proxy.config import MAX_DEFAULT_WORKERS, ReceiveMode, default_workers, load, usable_cores
from proxy.supervisor import reserve_port
from proxy.worker import config_from_json, config_to_json


def test_workers_setting_and_its_default() -> None:
    assert 1 <= default_workers() <= MAX_DEFAULT_WORKERS
    assert default_workers() == min(usable_cores(), MAX_DEFAULT_WORKERS)
    assert load(env={}).worker_count() == default_workers()
    assert load(env={}, workers=1).worker_count() == 1
    assert load(env={"RMQ_PROXY_WORKERS": "3"}).worker_count() == 3
    with pytest.raises(ValueError, match="workers"):
        load(env={}, workers=-1)


def test_a_worker_gets_the_whole_configuration() -> None:
    config = load(
        env={},
        namesrv_addrs=["10.0.0.1:9876", "10.0.0.2:9876"],
        event_log_dir="/var/log/rmq",
        receive_mode="notify",
        receive_max_in_flight=123,
        workers=2,
    )
    again = config_from_json(config_to_json(config))
    assert again == config
    assert again.receive.mode is ReceiveMode.NOTIFY


def test_the_reserved_port_is_shared_by_reuse_port_listeners() -> None:
    reservation = reserve_port("127.0.0.1", 0)
    port = reservation.getsockname()[1]
    listeners = []
    try:
        assert port > 0
        for _ in range(2):  # what each worker's gRPC server does
            s = socket.socket()
            listeners.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # anyone else is kept out
    finally:
        for s in [reservation, *listeners]:
            s.close()
