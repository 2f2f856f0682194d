"""The DRA driver's wire format, which the daemon writes and ``doctor`` reads.

Everything another process sees of the driver is named here once: the devices it
publishes and their attributes, capacities, taints and annotations (``dra.py``), the
checkpoint file that lists its prepared claims (``checkpoint.py``), and the CDI specs it
writes per claim (``cdi.py``). ``tools/`` may not import the daemon; both import this,
so the two can never spell a name differently. It imports nothing of the package but
``kit``.
"""
