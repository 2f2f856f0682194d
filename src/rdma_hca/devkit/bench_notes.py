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
protobuf about 2: the bare floor holds these too. Beyond it, for the device plugin: our
modules about 3.5 MiB and the heap after start about 5.5 (discovery, the gRPC servers, the
worker threads' malloc arenas); then, loaded by the first `/metrics` scrape and not before,
prometheus_client about 3.5 (its own code is about 0.5; the rest is the standard library its
package imports for servers and push gateways we do not use: http.server, urllib.request,
email, wsgiref, gzip). The figure after start is taken after one scrape, as a daemon on a
node is scraped; its note gives the figure before it (about 43.7 MiB, 1.17x the floor,
against 47.2 after the scrape). PyYAML (1.3 MiB) is loaded only when a config file is read;
the chart always gives one, so a deployed daemon holds it. The DRA driver adds the API
client's stack: httpcore2 (with anyio, h11, h2 and truststore) about 3.7 MiB, lightkube 2.5
(it loads PyYAML for kubeconfigs), httpx2 2.4 (its version lookup loads importlib.metadata,
zipfile and email) and msgspec 0.7, and one TLS context (1.4 MiB with a CA file; about 5 MiB
with the system trust store, as outside a cluster).

**Start-up.** Of the device plugin's path from spawn to registration, the imports are most
(about 210 ms on an idle machine against about 100 ms for the whole bare process); grpc and
protobuf are the floor's too. Deferred to where they are first used: prometheus_client (about
50 ms, to the first scrape, on its worker thread), PyYAML (about 15 ms, to reading a config
file or a kubeconfig) and the tools' modules that `rdma-hca serve` never runs (about 150 ms:
only serve's own parser is built when the command line names it). What remains of ours is
mostly class creation: each dataclass costs about 0.7 ms to create (generated methods are
compiled at import), and about 30 of them lie on the path (settings, node model, pools,
status). The DRA driver's start is longer by the API client's imports (about 200 ms; httpx2,
anyio's TLS streams and lightkube's models are the largest) and by connecting the client
before it registers.
"""
