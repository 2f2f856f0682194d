#!/usr/bin/env bash
# Regenerates the committed Python code for src/rdma_hca/daemon/_proto/api.proto.
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
