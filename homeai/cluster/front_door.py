"""``homeai serve --cluster HOST[:PORT]``: the Ray head beside the front door, and the cluster gateway on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from homeai.cluster.ray_process import cluster_token, connect, split_address, start_head, use_token
from homeai.gateway.gateway import GatewayConfig
from homeai.gateway.metering import Meter
from homeai.policy.store import PolicyHolder

if TYPE_CHECKING:
    from homeai.cluster.cluster_gateway import ClusterGateway


def cluster_gateway(address: str, data_dir: Path, policy_holder: PolicyHolder, config: GatewayConfig,
                    meter: Meter) -> tuple[ClusterGateway, Callable[[], None]]:
    """Start the head bound to ``address`` (token authentication on), connect to it, and return the
    gateway (not started) with what stops the head after the gateway's shutdown."""
    host, port = split_address(address)
    use_token(cluster_token(data_dir))  # before Ray is imported: it reads the token mode once
    import ray

    from homeai.cluster.cluster_gateway import ClusterGateway

    head = start_head(host, port)
    try:
        connect(f"{host}:{port}")
    except BaseException:
        head.stop()
        raise

    def stop() -> None:
        ray.shutdown()
        head.stop()

    return ClusterGateway(policy_holder, config, meter=meter, cluster_address=f"{host}:{port}"), stop
