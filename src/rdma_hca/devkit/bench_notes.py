"""What profiling found, written into ``BENCHMARKS.md`` under the figures: where a Prepare's
time goes beside the bare servicer's, and where the front ends' memory goes. The figures
themselves come from each run; this says what they are made of and what is left."""

NOTES = """\
## Where the time and memory go

**How the children run.** Every process the bench starts runs our modules with their
bytecode compiled beforehand, as pip compiles it when it installs the wheel into the image
(the image sets PYTHONDONTWRITEBYTECODE only so that nothing is written at run time).
Start-up is timed on runs that import nothing ahead; the footprint section's first run of
each front end imports its packages one at a time for the memory split and is not timed.
The DRA driver's footprint is taken against the fake API server over HTTPS with the
cluster's CA alone, as in a pod.

**One Prepare against the bare servicer** (default settings, POD_UID set). Both do the same
I/O: one claim GET, one CDI spec and one checkpoint written with fsync and rename. A claim
this instance has not seen is read and planned at once; the checkpoint is read under its
lock on the commit's thread when the entry is written (another instance's entry for the
claim, if one is there by then, is the answer and nothing of ours is written). The CDI
spec is written and fsynced on a second worker while the checkpoint is, and renamed into
place just before the checkpoint's rename, so the two fsyncs overlap; the directory is
fsynced after the rename (the bare servicer does not, so its rename is not yet durable when
it answers). A checkpoint write encodes only the claims that changed. What is left beyond
the bare servicer is the one hand-off to the commit's thread and the lock.

**Memory.** The footprint section splits each front end's RSS: an interpreter is about
9.5 MiB, the standard library that asyncio and ssl bring about 11.5, grpc about 10 and
protobuf about 2: the bare floor holds these too. Beyond it, for the device plugin: our
modules about 2.5 MiB, asyncinotify (with ctypes) about 1, and the heap after start about 4.5
(discovery, the gRPC servers, the worker threads' malloc arenas); before its first scrape
the device plugin is about 1.13x the floor. The first `/metrics` scrape loads
prometheus_client, about 2.7 MiB, most of it the standard library its package imports for
servers and push gateways we do not use (http.server, urllib.request, email, wsgiref,
gzip): its public API cannot be imported without them. The figure after start is taken
after that scrape, as a daemon on a node is scraped. PyYAML (1.3 MiB) is loaded only when a
config file is read. The DRA driver adds the API client's stack: httpx2 about 3.8 MiB (its
version lookup loads importlib.metadata, zipfile and email), httpcore2 about 3.2 (its
package always imports h2, anyio and truststore), lightkube 2.5 (its package loads its
clients, models, PyYAML and msgspec whatever is imported of it) and msgspec 0.9; and one TLS
context with the cluster's CA. None of these loads can be avoided through the libraries'
public APIs; the client itself stays (a maintained async client, not a hand-written one).

**Start-up.** The DRA driver registers with the kubelet before its API client is built:
lightkube's imports and the TLS context are made on a worker thread once the sockets are
served, and a Prepare that comes earlier waits for them. What the device plugin imports of
ours is mostly class creation (each dataclass costs about 0.7 ms to create); the tools'
modules that `rdma-hca serve` never runs are not imported, prometheus_client loads at the
first scrape and PyYAML when a file is read.
"""
