"""Generated code for the kubelet device plugin API v1beta1 (see api.proto), and the DRA
kubelet APIs beside it (``dra/``).

Regenerate with ``scripts/gen-proto.sh``; ``tests/test_proto.py`` fails when the
committed files differ from what the pinned generator produces. Each module is imported by
name where it is used (``from rdma_hca.daemon._proto import api_pb2``): the package loads
none of them, so the DRA driver alone never builds the device plugin's messages.
"""
