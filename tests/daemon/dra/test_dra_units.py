"""Pure parts of the driver: device names, the config from settings, the wire format."""

from __future__ import annotations

import re

from rdma_hca.daemon._proto.dra import (
    dra_v1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_v1_pb2,
)
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.devices import device_names
from rdma_hca.settings.model import DraConfig, Mode, Settings

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def test_device_names_are_unique_dns_labels() -> None:
    names = device_names(["mlx5_0", "mlx5_1", "mlx5_10", "mlx5-1", "MLX5_1", "rxe/eth0",
                          "_", "x" * 80])
    assert len(set(names.values())) == len(names)
    assert all(DNS_LABEL.match(v) for v in names.values())
    assert names["mlx5_0"] == "mlx5-0" and names["mlx5_10"] == "mlx5-10"
    # mlx5_1, mlx5-1 and MLX5_1 all map to mlx5-1: each gets a suffix of its own name,
    # so adding one HCA never renames another's device.
    clash = [names[n] for n in ("mlx5_1", "mlx5-1", "MLX5_1")]
    assert all(c.startswith("mlx5-1-") for c in clash)
    assert device_names(["mlx5_1", "mlx5-1"])["mlx5_1"] == names["mlx5_1"]


def test_config_from_settings_follows_the_kubelet_root() -> None:
    settings = Settings(kubelet_root="/k", node_name="n7", dra=DraConfig(enabled=True))
    config = DriverConfig.from_settings(settings)
    assert config.node_name == "n7"
    assert config.driver_name == "rdma-hca.io"
    assert config.registration_socket == "/k/plugins_registry/rdma-hca.io-reg.sock"
    assert config.endpoint == "/k/plugins/rdma-hca.io/dra.sock"
    assert config.checkpoint == "/k/plugins/rdma-hca.io/checkpoint.json"
    assert config.read_deadline == settings.read_deadline_seconds == 5.0
    assert config.lock_path == "/k/plugins/rdma-hca.io/claims.lock"


def test_a_pod_uid_puts_both_sockets_beside_another_instances() -> None:
    """The upstream helper's rolling-update names: the registration and the DRA socket."""
    settings = Settings(kubelet_root="/k", node_name="n7", pod_uid="0f1e-2d",
                        dra=DraConfig(enabled=True))
    config = DriverConfig.from_settings(settings)
    assert config.registration_socket == "/k/plugins_registry/rdma-hca.io-0f1e-2d-reg.sock"
    assert config.endpoint == "/k/plugins/rdma-hca.io/dra-0f1e-2d.sock"
    # Shared by both instances: one checkpoint, one lock file.
    assert config.checkpoint == "/k/plugins/rdma-hca.io/checkpoint.json"


def test_the_mode_is_the_enum_whichever_way_it_came() -> None:
    settings = Settings(node_name="n", dra=DraConfig(enabled=True, mode="exclusive"))  # type: ignore[arg-type]
    assert DriverConfig.from_settings(settings).mode is Mode.EXCLUSIVE


def test_wire_format_is_the_kubelets() -> None:
    """Field numbers and packages on the wire; a renumbered field changes these bytes."""
    assert dra_v1_pb2.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert pluginregistration_v1_pb2.DESCRIPTOR.package == "pluginregistration"
    assert health_v1_pb2.DESCRIPTOR.package == "v1"
    assert health_v1alpha1_pb2.DESCRIPTOR.package == "v1alpha1"
    claim = dra_v1_pb2.Claim(namespace="n", uid="u", name="c")
    assert claim.SerializeToString().hex() == "0a016e1201751a0163"
    dev = dra_v1_pb2.Device(request_names=["r"], pool_name="p", device_name="d",
                            cdi_device_ids=["i"])
    assert dev.SerializeToString().hex() == "0a01721201701a016422016" "9"
    info = pluginregistration_v1_pb2.PluginInfo(type="t", name="n", endpoint="e",
                                                supported_versions=["v"])
    assert info.SerializeToString().hex() == "0a017412016e1a016522017" "6"
    status = pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True, error="x")
    assert status.SerializeToString().hex() == "08011201" "78"
    health = health_v1_pb2.DeviceHealth(
        device=health_v1_pb2.DeviceIdentifier(pool_name="p", device_name="d"),
        health=health_v1_pb2.UNHEALTHY, last_updated_time=1, health_check_timeout_seconds=2,
        message="m")
    assert health.SerializeToString().hex() == "0a060a017012016410021801200" "22a016d"
