"""The local RocketMQ's proxy option: what it writes and what it refuses (no JVM starts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.errors import InvalidArgumentError
from bridge.runtime.jars import ARTIFACT_SETS
from bridge.runtime.rocketmq import LocalRocketMQ, LocalRocketMQConfig


def test_grpc_port_and_proxy_properties_need_the_proxy(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="proxy=True"):
        LocalRocketMQConfig(data_dir=tmp_path, grpc_port=8081)
    with pytest.raises(InvalidArgumentError, match="proxy=True"):
        LocalRocketMQConfig(data_dir=tmp_path, proxy_properties={"grpcThreadPoolNums": 4})
    with pytest.raises(InvalidArgumentError, match="grpc_port"):
        LocalRocketMQConfig(data_dir=tmp_path, proxy=True, grpc_port=70_000)


def test_proxy_addr_without_a_proxy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="without a proxy"):
        _ = LocalRocketMQ(LocalRocketMQConfig(data_dir=tmp_path)).proxy_addr


def test_proxy_conf_runs_local_mode_on_the_picked_ports(tmp_path: Path) -> None:
    rmq = LocalRocketMQ(
        LocalRocketMQConfig(
            data_dir=tmp_path,
            proxy=True,
            grpc_port=40_001,
            proxy_properties={"minInvisibleTimeMillsForRecv": 1000, "grpcThreadPoolNums": 4},
        )
    )
    conf = rmq.proxy_conf()
    assert conf["proxyMode"] == "local"
    assert conf["grpcServerPort"] == 40_001
    assert rmq.proxy_addr == "127.0.0.1:40001"
    assert conf["namesrvAddr"] == rmq.namesrv_addr
    # The proxy's own remoting server gets a port of its own, not its default 8080.
    assert conf["remotingListenPort"] not in (8080, 0)
    assert conf["remotingListenPort"] != conf["grpcServerPort"]
    # Given entries win over the derived ones.
    assert conf["minInvisibleTimeMillsForRecv"] == 1000
    assert conf["grpcThreadPoolNums"] == 4
    # The ports are remembered in the data directory, as the others are.
    state = json.loads((tmp_path / "rocketmq.json").read_text())
    assert state["grpc_port"] == 40_001
    assert state["proxy_remoting_port"] == conf["remotingListenPort"]


def test_the_v5_client_is_a_set_of_its_own() -> None:
    """RocketMQ 5's Java gRPC client bundles the v2 protocol classes that the broker's jars
    hold too: the two never share a class path."""
    client = ARTIFACT_SETS["rocketmq-client-v5"].coordinates
    assert client == (f"org.apache.rocketmq:rocketmq-client-java:{client[0].split(':')[2]}",)
    proxy = ARTIFACT_SETS["rocketmq-proxy"].coordinates
    assert any(c.startswith("org.apache.rocketmq:rocketmq-proxy:") for c in proxy)
    assert not any("client-java" in c for name in ("rocketmq", "rocketmq-proxy")
                   for c in ARTIFACT_SETS[name].coordinates)  # fmt: skip
