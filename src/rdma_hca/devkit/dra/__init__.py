"""What the DRA driver is tested, demonstrated and measured against.

``DraKubelet`` is the kubelet side: plugin watcher, DRA calls, health stream, restarts;
``DraStage`` puts it together with the driver, a simulated node and the fake API server
(``rdma_hca.devkit.kube.apiserver``, shared with doctor's tests).
"""
