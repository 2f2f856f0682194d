"""The committed generated code matches api.proto, and the wire format is pinned.

The kubelet only cares about package, message and field numbers and types: a golden
byte string per message catches a renumbered or retyped field even when the
generated code was regenerated to match the mistake.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "src" / "rdma_hca" / "daemon" / "_proto"
GENERATED = ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi"]
DRA_PROTOS = ["pluginregistration_v1", "dra_v1", "dra_v1beta1", "health_v1alpha1",
              "health_v1beta1", "health_v1"]
GENERATED += [f"dra/{p}{suffix}" for p in DRA_PROTOS
              for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")]


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True,
                   env=env, capture_output=True)
    for name in GENERATED:
        fresh = (tmp_path / name).read_text()
        committed = (PROTO_DIR / name).read_text()
        assert fresh == committed, (
            f"src/rdma_hca/daemon/_proto/{name} is stale: run `make proto` and commit the result"
        )


def test_package_and_method_paths() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    services = {s.full_name: [m.name for m in s.methods]
                for s in api_pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": ["GetDevicePluginOptions", "ListAndWatch",
                                 "GetPreferredAllocation", "Allocate", "PreStartContainer"],
    }
    assert hasattr(api_pb2_grpc, "DevicePluginServicer")


GOLDEN: list[tuple[object, str]] = [
    (api_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True),
     "08011001"),
    (api_pb2.RegisterRequest(version="v1beta1", endpoint="a.sock", resource_name="rdma/hca",
                             options=api_pb2.DevicePluginOptions(pre_start_required=True)),
     # 1: "v1beta1", 2: "a.sock", 3: "rdma/hca", 4: {1: true}
     "0a0776316265746131" "1206612e736f636b" "1a0872646d612f686361" "22020801"),
    (api_pb2.Device(ID="x", health="Healthy",
                    topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1)])),
     "0a0178120748" "65616c7468791a040a020801"),
    (api_pb2.PreStartContainerRequest(devices_ids=["a"]), "0a0161"),
    (api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["a"],
                                                 must_include_deviceIDs=["b"],
                                                 allocation_size=2),
     "0a01611201621802"),
    (api_pb2.ContainerPreferredAllocationResponse(deviceIDs=["a"]), "0a0161"),
    (api_pb2.ContainerAllocateRequest(devices_ids=["a"]), "0a0161"),
    (api_pb2.CDIDevice(name="v.io/c=n"), "0a08762e696f2f633d6e"),
    (api_pb2.Mount(container_path="/c", host_path="/h", read_only=True), "0a022f6312022f681801"),
    (api_pb2.DeviceSpec(container_path="/c", host_path="/h", permissions="rw"),
     "0a022f6312022f681a027277"),
]


@pytest.mark.parametrize(("message", "hexbytes"), GOLDEN,
                         ids=[type(m).__name__ for m, _ in GOLDEN])
def test_golden_bytes(message: object, hexbytes: str) -> None:
    wire: bytes = message.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    assert wire.hex() == hexbytes


def test_golden_nested_responses() -> None:
    resp = api_pb2.ContainerAllocateResponse()
    resp.envs["K"] = "V"
    resp.mounts.add(container_path="/m")
    resp.devices.add(container_path="/d")
    resp.annotations["A"] = "B"
    resp.cdi_devices.add(name="n")
    wire = resp.SerializeToString(deterministic=True).hex()
    # field 1 map entry, 2 mount, 3 device spec, 4 annotation map entry, 5 cdi device
    assert wire == "0a060a014b1201561204" "0a022f6d1a040a022f64220" "60a014112014" "22a030a016e"
    outer = api_pb2.AllocateResponse(container_responses=[api_pb2.ContainerAllocateResponse()])
    assert outer.SerializeToString().hex() == "0a00"
    law = api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID="a")])
    assert law.SerializeToString().hex() == "0a030a0161"
    par = api_pb2.PreferredAllocationRequest(
        container_requests=[api_pb2.ContainerPreferredAllocationRequest(allocation_size=1)])
    assert par.SerializeToString().hex() == "0a021801"
    ar = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest()])
    assert ar.SerializeToString().hex() == "0a00"
    pr = api_pb2.PreferredAllocationResponse(
        container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=["z"])])
    assert pr.SerializeToString().hex() == "0a030a017a"
