#!/usr/bin/env bash
# Regenerates the committed Python code for src/rdma_hca/daemon/_proto/api.proto and dra/*.proto.
# Usage: scripts/gen-proto.sh [OUTDIR]   (default: the package directory itself;
# the staleness test passes a temporary directory and compares).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
proto_dir="$here/src/rdma_hca/daemon/_proto"
out=${1:-$proto_dir}
python=${PYTHON:-python3}
# protoc finds the mypy plugins on PATH, next to the interpreter that has them.
export PATH="$(dirname "$(command -v "$python")"):$PATH"
mkdir -p "$out"
"$python" -m grpc_tools.protoc \
  -I "$proto_dir" \
  --python_out="$out" \
  --grpc_python_out="$out" \
  --mypy_out="$out" \
  --mypy_grpc_out="$out" \
  "$proto_dir/api.proto"
# grpc_tools writes "import api_pb2"; inside the package it must be relative.
sed -i 's/^import api_pb2 as api__pb2$/from . import api_pb2 as api__pb2/' "$out/api_pb2_grpc.py"
sed -i 's/^import api_pb2 as _api_pb2$/from . import api_pb2 as _api_pb2/' "$out/api_pb2_grpc.pyi"

# The kubelet's plugin registration, DRA and DRA health APIs, in a subpackage of their own.
dra_dir="$proto_dir/dra"
mkdir -p "$out/dra"
dra_protos=(pluginregistration_v1 dra_v1 dra_v1beta1 health_v1alpha1 health_v1beta1 health_v1)
"$python" -m grpc_tools.protoc \
  -I "$dra_dir" \
  --python_out="$out/dra" \
  --grpc_python_out="$out/dra" \
  --mypy_out="$out/dra" \
  --mypy_grpc_out="$out/dra" \
  $(for p in "${dra_protos[@]}"; do echo "$dra_dir/$p.proto"; done)
for p in "${dra_protos[@]}"; do
  mangled=${p//_/__}
  sed -i "s/^import ${p}_pb2 as ${mangled}__pb2\$/from . import ${p}_pb2 as ${mangled}__pb2/" \
    "$out/dra/${p}_pb2_grpc.py"
  sed -i "s/^import ${p}_pb2 as _${p}_pb2\$/from . import ${p}_pb2 as _${p}_pb2/" \
    "$out/dra/${p}_pb2_grpc.pyi"
done
