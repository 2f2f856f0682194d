"""What profiling found, written into ``BENCHMARKS.md`` under the figures: where a Prepare's
time goes beside the bare servicer's, and where the front ends' memory goes. The figures
themselves come from each run; this says what they are made of and what is left."""

NOTES = """\
## Where the time and memory go

**One Prepare against the bare servicer** (cProfile over 100 fresh claims, default settings,
POD_UID set, and a count of the calls run off the event loop, by key and caller). Both do the
same I/O: one claim GET, one CDI spec and one checkpoint written with fsync and rename. The
bare servicer hops to a worker thread once, for both writes. The driver hops twice:

1. `prepared.py` `look_up`: the checkpoint read again under the claim's record lock (another
   instance may have prepared the claim); the claim's GET runs meanwhile when this instance
   has not seen the claim on the record;
2. `groupcommit.py` `_write`: the device metadata files and the CDI spec, then the
   checkpoint, written and fsynced on one thread (undone there when the entry is not
   written).

The claim's record lock in `claims.lock` is tried and dropped on the event loop: one
`fcntl(F_OFD_SETLK)` on a descriptor opened at start, which never sleeps on a filesystem
whose locks the kernel keeps itself (checked when the lock file is opened; elsewhere it
runs off the loop). The checkpoint follower skips the renames of the driver's own writes
(counted before each rename) instead of reading the file back. Each hop is a thread
hand-off and a wake of the event loop (0.3 to 0.7 ms each when the machine is busy). What
is left beyond the bare servicer: the checkpoint read under the lock (the price of sharing
the checkpoint with another instance), and the claim's status write after the answer (one
apply), which goes out on the loop meanwhile. Parsing and planning (`claims.py`, `_plan`,
`_files_of`) are under 0.1 ms a claim.

**Memory.** The footprint section splits each front end's RSS: an interpreter is about
10 MiB, the standard library that asyncio and ssl bring about 12, grpc about 10 and
protobuf about 2: the bare floor holds these too. Beyond it, for the device plugin:
prometheus_client about 3.5 MiB (its own code is about 0.5; the rest is the standard
library its exposition module imports for servers and push gateways we do not use:
http.server, urllib.request, email, pickle), our modules about 3.5, PyYAML 1.3 and the
heap after start about 5.5 (discovery, the gRPC servers, the worker threads' malloc arenas).
The DRA driver adds the API client's stack: httpcore2 (with anyio, h11, h2 and truststore)
about 3.7 MiB, lightkube 2.5, httpx2 2.4 and msgspec 0.7, and one TLS context (1.4 MiB with
a CA file; about 5 MiB with the system trust store, as outside a cluster).
"""
