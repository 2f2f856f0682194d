"""Simulated machines for tests, the demo and benchmarks.

Nothing here is imported by the daemon's serving path: these modules only write
trees shaped like a real node's ``/sys`` and ``/dev`` so the real code can read them.
The catalogue is ``nodes``.
"""
