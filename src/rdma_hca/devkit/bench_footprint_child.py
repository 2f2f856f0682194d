"""The measured process of the footprint figures (``bench_footprint``): ``rdma-hca serve`` as
it runs on a node, with its imports taken one package at a time first.

``python -m rdma_hca.devkit.bench_footprint_child order ENTRY...`` imports the entry modules
and prints, as JSON, the top-level packages they loaded in the order they were first
imported, and what one TLS context costs (as the API client builds one outside a cluster).

``python -m rdma_hca.devkit.bench_footprint_child run REPORT GROUPS -- SERVE-ARGS...`` imports
GROUPS (``label=mod,mod;label=mod``) one group at a time, noting VmRSS after each, then
runs ``rdma-hca SERVE-ARGS`` in this process: the same code, start-up and memory as the
command. On SIGUSR1 it writes what it holds to REPORT (JSON): VmRSS and its anonymous and
file-backed parts, thread stacks, threads by name, TLS contexts made, packages loaded since
the imports, and when each start-up phase ended (wall clock, for the parent to compare
with its spawn time).

Only ``sys``, ``os`` and ``time`` (loaded with the interpreter) are used before the first
figure, so the interpreter's own figure is that of a bare ``python``.
"""

import os
import sys
import time

_MAIN = time.time()


def _status() -> dict[str, int]:
    wanted = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads")
    out: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in wanted:
                out[key] = int(rest.split()[0])
    return out


def _rss() -> int:
    return _status()["VmRSS"]


def _mappings() -> list[tuple[str, int, int]]:
    """(path, size KiB, resident KiB) of each mapping; anonymous ones have no path."""
    out: list[tuple[str, int, int]] = []
    path, size = "", 0
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            first = line.split(None, 5)
            if "-" in first[0] and not first[0].endswith(":"):
                path = first[5].strip() if len(first) > 5 else ""
            elif first[0] == "Size:":
                size = int(first[1])
            elif first[0] == "Rss:":
                out.append((path, size, int(first[1])))
    return out


def _stacks_kib(maps: list[tuple[str, int, int]]) -> int:
    """Resident KiB of thread stacks: the main thread's [stack], and anonymous mappings of
    exactly the stack size limit (glibc's size for new threads, grpc's and Python's alike;
    merged runs of heap arenas can come close to it, never to the page)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = 8192 if soft == resource.RLIM_INFINITY else soft // 1024
    return sum(rss for path, size, rss in maps
               if path == "[stack]" or (not path and stack <= size <= stack + 4))


def _top(names: object) -> set[str]:
    return {str(n).split(".")[0] for n in names}  # type: ignore[attr-defined]


def _owners(entries: list[str]) -> list[tuple[str, list[str]]]:
    """Import ``entries`` and say who brought in each module, as import groups in the order
    they first appeared: a package's own modules are its own, a standard module belongs to
    the package whose import loaded it, and what our code loads of the standard library
    (or the interpreter) is the group "stdlib"; ours come last."""
    import builtins
    import importlib

    std = sys.stdlib_module_names
    groups: dict[str, list[str]] = {"stdlib": []}
    stack: list[str] = []
    real = builtins.__import__

    def label_for(importer: str) -> str:
        top = importer.split(".")[0]
        if top == "rdma_hca" or not top:
            return "stdlib"
        if top not in std:
            return top
        return stack[-1] if stack else "stdlib"

    def tracing(name: str, globals: dict[str, object] | None = None, *args: object,
                **kw: object) -> object:
        label = label_for(str((globals or {}).get("__name__", "")))
        before = set(sys.modules)
        stack.append(label)
        try:
            return real(name, globals, *args, **kw)  # type: ignore[arg-type]
        finally:
            stack.pop()
            for mod in [m for m in sys.modules if m not in before]:
                top = mod.split(".")[0]
                owner = label if top in std else top
                if not any(mod in mods for mods in groups.values()):
                    groups.setdefault(owner, []).append(mod)

    builtins.__import__ = tracing  # type: ignore[assignment]
    try:
        for entry in entries:
            importlib.import_module(entry)
    finally:
        builtins.__import__ = real
    groups.pop("rdma_hca", None)
    return [*groups.items(), ("rdma_hca", entries)]


def order(entries: list[str]) -> int:
    import json

    groups = _owners(entries)
    before = _rss()
    tls_kind = "ssl.create_default_context()"
    try:
        import httpcore2

        httpcore2.default_ssl_context(_trust_env=False)
        tls_kind = "httpcore2.default_ssl_context() (the system trust store)"
    except ImportError:
        import ssl

        ssl.create_default_context()
    print(json.dumps({"groups": groups, "tls_context_kib": _rss() - before,
                      "tls_kind": tls_kind}))
    return 0


def run(report: str, groups: str, serve: list[str]) -> int:
    import importlib

    rss = [("interpreter", _rss())]
    for group in filter(None, groups.split(";")):
        label, _, mods = group.partition("=")
        for mod in filter(None, mods.split(",")):
            importlib.import_module(mod)
        rss.append((label, _rss()))
    marks = {"main": _MAIN, "imports": time.time()}
    imported = _top(list(sys.modules))

    import json
    import signal
    import ssl
    import threading

    made = [0]
    plain_new = ssl.SSLContext.__new__

    def counting_new(cls: type, *args: object, **kw: object) -> object:
        made[0] += 1
        return plain_new(cls, *args, **kw)  # type: ignore[call-overload]

    ssl.SSLContext.__new__ = counting_new  # type: ignore[method-assign,assignment]

    from rdma_hca import cli
    from rdma_hca.daemon import main as daemon_main
    from rdma_hca.daemon.watch.health import HealthWatcher

    plain_refresh = HealthWatcher.refresh

    async def stamped_refresh(self: HealthWatcher, *a: object, **kw: object) -> object:
        got = await plain_refresh(self, *a, **kw)
        marks.setdefault("sysfs", time.time())
        return got

    HealthWatcher.refresh = stamped_refresh  # type: ignore[method-assign,assignment]
    plain_settle = daemon_main.settle_heap

    def stamped_settle() -> None:
        marks.setdefault("started", time.time())
        plain_settle()

    daemon_main.settle_heap = stamped_settle

    def write_report(signum: int, frame: object) -> None:
        maps = _mappings()
        doc = {
            "status_kib": _status(),
            "stacks_kib": _stacks_kib(maps),
            "big_anonymous_kib": sorted(((size, rss) for path, size, rss in maps
                                         if not path and rss >= 1024), reverse=True),
            "imports_kib": rss,
            "threads": sorted(t.name for t in threading.enumerate()),
            "tls_contexts_made": made[0],
            "loaded_after_imports": sorted(_top(list(sys.modules)) - imported),
            "marks": marks,
        }
        tmp = report + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, report)

    signal.signal(signal.SIGUSR1, write_report)
    return cli.main(serve)


def main(argv: list[str]) -> int:
    if argv[:1] == ["order"]:
        return order(argv[1:])
    if argv[:1] == ["run"] and len(argv) >= 4 and argv[3] == "--":
        return run(argv[1], argv[2], argv[4:])
    print("usage: bench_footprint_child order ENTRY... | run REPORT GROUPS -- SERVE-ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
