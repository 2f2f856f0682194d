"""What the DRA driver is tested, demonstrated and measured against.

``FakeApiServer`` stores ResourceSlices and ResourceClaims over real HTTP on loopback;
``DraKubelet`` is the kubelet side: plugin watcher, DRA calls, health stream, restarts.
"""
