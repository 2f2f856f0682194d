"""``rdma-hca check``: from inside a workload's container, can this process use RDMA?

It looks only at what the container itself sees: the device nodes the plugin handed over,
the HCAs named in ``RDMA_HCA_DEVICES`` (set by the plugin's Allocate), the memlock limit,
``CAP_IPC_LOCK`` and the size of ``/dev/shm``. Each of these, when wrong, makes verbs or
NCCL fail later with an error that does not name the cause; here each gets a fix.

With ``--nccl`` it also checks the NCCL/UCX variables the container has against what
it sees (``tools/check_nccl.py``): a finding that would keep NCCL off RDMA (TCP sockets,
a GID that connects nothing) fails the check; the others are printed with their fix.

Reading sysfs is bounded by a deadline (``--read-deadline``, 5 s): a file that does not
answer fails the check of the HCA it belongs to and is named.

Exit status: 0 when every check passes (advisory NCCL findings aside), 1 when one fails
(a file that did not answer, or discovery that ran out of a resource, is a failed
check), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from rdma_hca.kit.exitcodes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from rdma_hca.node.deadline_reader import DEFAULT_DEADLINE, discover_bounded
from rdma_hca.node.file_reads import DiscoveryFailed
from rdma_hca.node.model import Hca, NodeInventory
from rdma_hca.settings.decl import BY_KEY, add_flags
from rdma_hca.settings.model import ConfigError
from rdma_hca.tools.arguments import mounted_dir
from rdma_hca.tools.check_nccl import Finding, nccl_findings
from rdma_hca.tools.deadline import read_deadline
from rdma_hca.tools.doctor.render import checks_json, checks_text, summary
from rdma_hca.tools.doctor.result import Check, parse_command
from rdma_hca.tools.report import clean_json, printable_lines

SUBJECT = "container"
CAP_IPC_LOCK = 14
MIN_SHM_BYTES = 1 << 30
ENV_DEVICES = "RDMA_HCA_DEVICES"
ASK_FOR_RESOURCE = "add resources.limits rdma/hca: 1 to this container"
MEMLOCK_FIX = ("set memlock unlimited in the container runtime / add IPC_LOCK "
               "(containerd/dockerd service: LimitMEMLOCK=infinity; docker run: "
               "--ulimit memlock=-1)")
IPC_LOCK_FIX = "add IPC_LOCK to securityContext.capabilities.add"
SHM_FIX = ("mount an emptyDir with medium: Memory at /dev/shm (e.g. sizeLimit: 8Gi, as the "
           "example Job does)")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``check`` subcommand; its ``func`` returns the exit status."""
    p = subparsers.add_parser(
        "check",
        help="inside a workload: check device nodes, HCAs, memlock, IPC_LOCK and /dev/shm "
        "(--nccl: and the NCCL/UCX variables)",
        description="Check, from inside a container that asked for rdma/hca, that RDMA can "
        "work here. Exit 0: all checks pass; 1: a check fails; 2: bad flags.",
    )
    p.add_argument("--proc-root", default="/proc", type=mounted_dir("procfs"),
                   help="where procfs is mounted")
    p.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted")
    p.add_argument("--dev-root", default="/dev", help="where device nodes live")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--nccl", action="store_true",
                   help="also check the NCCL/UCX variables: the HCAs and ports they name, the "
                   "RoCE GID they select; exit 1 when NCCL would not use RDMA")
    add_flags(p, [BY_KEY["readDeadlineSeconds"]])
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
        out: TextIO | None = None) -> int:
    stream = out if out is not None else sys.stdout
    environ = os.environ if env is None else env
    # One discovery for the HCA checks and the NCCL ones: a file that hangs costs the
    # check one read deadline, not two.
    discovery = CachedInventory(Path(args.sysfs_root), Path(args.dev_root), read_deadline(args))
    checks = run_checks(
        proc_root=Path(args.proc_root),
        sysfs_root=Path(args.sysfs_root),
        dev_root=Path(args.dev_root),
        env=environ,
        discovery=discovery,
    )
    ok = all(c.ok for c in checks)
    advisory: list[str] = []
    if args.nccl:
        findings = nccl_checks(Path(args.sysfs_root), environ, discovery)
        ok = ok and not any(f.fatal and not f.ok for f in findings)
        advisory = [f.name for f in findings if not f.ok and not f.fatal]
        checks.extend(Check(SUBJECT, f.name, f.ok, f.detail, f.fix) for f in findings)
    if args.json:
        doc = clean_json({"ok": ok, "checks": checks_json(checks), "advisory": advisory})
        stream.write(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    else:
        tail = summary(checks)
        if ok and advisory:
            tail += (f" ({len(advisory)} advisory: NCCL still uses RDMA, exit 0)")
        stream.write(printable_lines(checks_text(checks) + "\n\n" + tail) + "\n")
    return EXIT_OK if ok else EXIT_FAIL


class CachedInventory:
    """The container's view of the node, discovered once (with its deadline) for every
    check that asks; a failure is kept and raised again, as the first call saw it."""

    def __init__(self, sysfs_root: Path, dev_root: Path, deadline: float) -> None:
        self.sysfs_root, self.dev_root, self.deadline = sysfs_root, dev_root, deadline
        self._result: NodeInventory | DiscoveryFailed | None = None

    def __call__(self) -> NodeInventory:
        if self._result is None:
            try:
                self._result = discover_bounded(self.sysfs_root, self.dev_root,
                                                deadline=self.deadline)
            except DiscoveryFailed as exc:
                self._result = exc
        if isinstance(self._result, DiscoveryFailed):
            raise self._result
        return self._result


def nccl_checks(sysfs_root: Path, env: Mapping[str, str],
                discovery: CachedInventory) -> list[Finding]:
    """The NCCL/UCX findings, from the same bounded discovery as the HCA checks."""
    try:
        inv = discovery()
    except DiscoveryFailed as exc:
        return [Finding("NCCL HCA discovery", False, str(exc),
                        "raise the container's limits and run the check again", fatal=True)]
    return nccl_findings(inv, env, sysfs_root)


def run_checks(
    *, proc_root: Path, sysfs_root: Path, dev_root: Path, env: Mapping[str, str],
    deadline: float = DEFAULT_DEADLINE, discovery: CachedInventory | None = None,
) -> list[Check]:
    """Every check, in the order a user should fix them."""
    checks = device_node_checks(dev_root)
    checks.extend(hca_checks(env, discovery or CachedInventory(sysfs_root, dev_root, deadline)))
    ipc_lock = ipc_lock_check(proc_root)
    checks.append(memlock_check(proc_root, ipc_lock=ipc_lock.ok))
    checks.append(ipc_lock)
    checks.append(shm_check(proc_root, dev_root))
    return checks


# ------------------------------------------------------------------------------ device nodes


def _openable(path: Path) -> str | None:
    """None when the node opens read-write (what verbs needs), else why it does not."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    return None


def _device_check(path: Path, shown: str) -> Check:
    if not path.exists():
        return Check(SUBJECT, shown, False, "missing",
                     f"{ASK_FOR_RESOURCE}; without hostNetwork: true the plugin must allow "
                     "non-hostNetwork pods (nonHostNetwork: true)")
    problem = _openable(path)
    if problem is not None:
        return Check(SUBJECT, shown, False, f"cannot be opened read-write ({problem})",
                     "the device cgroup does not allow it: request rdma/hca (not a hostPath "
                     "mount) so the plugin grants rw, or run the pod privileged")
    return Check(SUBJECT, shown, True, "present, opens read-write")


def device_node_checks(dev_root: Path) -> list[Check]:
    """rdma_cm and every uverbs node the container has; verbs opens both read-write."""
    ib = dev_root / "infiniband"
    checks = [_device_check(ib / "rdma_cm", "/dev/infiniband/rdma_cm")]
    try:
        uverbs = sorted((p for p in ib.iterdir() if p.name.startswith("uverbs")),
                        key=lambda p: (len(p.name), p.name))
    except OSError:
        uverbs = []
    if not uverbs:
        checks.append(Check(SUBJECT, "/dev/infiniband/uverbs*", False, "none in this container",
                            ASK_FOR_RESOURCE))
    checks.extend(_device_check(p, f"/dev/infiniband/{p.name}") for p in uverbs)
    return checks


# ------------------------------------------------------------------------------------- HCAs


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def hca_checks(env: Mapping[str, str], discovery: CachedInventory) -> list[Check]:
    """Every HCA the plugin named must be visible here, have a port up and its device node."""
    raw = env.get(ENV_DEVICES)
    if raw is None:
        return [Check(SUBJECT, ENV_DEVICES, False,
                      "not set: this container did not ask for rdma/hca", ASK_FOR_RESOURCE)]
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        return [Check(SUBJECT, ENV_DEVICES, False,
                      "empty: the plugin had no usable HCA to give when this pod started",
                      "check the node: kubectl -n kube-system exec <plugin pod> -- "
                      "rdma-hca doctor --node, then recreate this pod")]
    # The daemon's own discovery, so "visible" means what the plugin would also see.
    try:
        inv = discovery()
    except DiscoveryFailed as exc:
        return [Check(SUBJECT, "HCA discovery", False, str(exc),
                      "the container is out of file descriptors or memory: raise its limits "
                      "and run the check again")]
    found = {h.name: h for h in inv.hcas}
    checks = [_hca_check(found.get(name), name, discovery.sysfs_root) for name in names]
    if inv.stalled:
        checks.append(Check(SUBJECT, "sysfs reads", False,
                            f"{len(inv.stalled)} file(s) did not answer within "
                            f"{discovery.deadline:g} s: "
                            + ", ".join(inv.stalled),
                            "the HCA driver is stuck (often on its firmware): the HCAs these "
                            "files belong to count as down; check the node with rdma-hca "
                            "doctor --node and dmesg"))
    return checks


def _hca_check(hca: Hca | None, name: str, sysfs_root: Path) -> Check:
    title = f"HCA {name}"
    if hca is None:
        return Check(SUBJECT, title, False,
                     f"not visible in {sysfs_root}/class/infiniband",
                     "the kernel's RDMA netns mode is exclusive or the pod is not on the host "
                     "network: use hostNetwork: true, or check the node with rdma-hca doctor "
                     "--node")
    shown = ", ".join(f"port {p.number} {p.state}/{p.phys_state}" for p in hca.ports)
    shown = shown or "no ports"
    missing = [n.path for n in hca.device_nodes() if not n.present]
    if missing:
        return Check(SUBJECT, title, False,
                     f"{shown}, but its device node {', '.join(missing)} is not in this "
                     "container", ASK_FOR_RESOURCE)
    if hca.any_port_up:
        return Check(SUBJECT, title, True, shown)
    return Check(SUBJECT, title, False, f"no port up ({shown})",
                 "check the cable and the switch port of this HCA (rdma-hca doctor --node "
                 "on the node lists every port)")


# --------------------------------------------------------------------- memlock, caps, shm


def _human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def memlock_check(proc_root: Path, *, ipc_lock: bool = False) -> Check:
    """The soft RLIMIT_MEMLOCK: registering memory with an HCA pins (locks) it.

    A process with CAP_IPC_LOCK may lock memory beyond the limit (the kernel's
    can_do_mlock), so then the limit does not matter and the check passes whatever it is.
    """
    title = "memlock limit"
    limits = proc_root / "self" / "limits"
    text = _read(limits)
    if ipc_lock:
        shown = _soft_memlock(text) if text is not None else None
        said = "unlimited" if shown == "unlimited" else (
            f"{_human_bytes(int(shown))} (soft limit)" if shown and shown.isdigit()
            else "not readable")
        return Check(SUBJECT, title, True,
                     f"{said}; does not matter: CAP_IPC_LOCK lets this process lock more")
    if text is None:
        return Check(SUBJECT, title, False, f"cannot read {limits}",
                     "mount /proc in the container (it always is, unless --proc-root is wrong)")
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory"):].split()
            soft = fields[0] if fields else ""
            if soft == "unlimited":
                return Check(SUBJECT, title, True, "unlimited")
            if soft.isdigit():
                return Check(SUBJECT, title, False,
                             f"{_human_bytes(int(soft))} (soft limit): too small to register "
                             "RDMA buffers", MEMLOCK_FIX)
            break
    return Check(SUBJECT, title, False, f"no readable 'Max locked memory' line in {limits}",
                 MEMLOCK_FIX)


def _soft_memlock(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory"):].split()
            return fields[0] if fields else None
    return None


def ipc_lock_check(proc_root: Path) -> Check:
    """CAP_IPC_LOCK in the effective set lets verbs pin memory beyond the memlock limit."""
    title = "CAP_IPC_LOCK"
    status = proc_root / "self" / "status"
    text = _read(status)
    cap_eff = None
    for line in (text or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                cap_eff = int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                cap_eff = None
    if cap_eff is None:
        return Check(SUBJECT, title, False, f"no readable CapEff line in {status}", IPC_LOCK_FIX)
    if cap_eff >> CAP_IPC_LOCK & 1:
        return Check(SUBJECT, title, True, "in the effective capabilities")
    return Check(SUBJECT, title, False,
                 f"not in the effective capabilities (CapEff {cap_eff:016x})", IPC_LOCK_FIX)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _size_option(options: str) -> int | None:
    """Bytes of a tmpfs ``size=`` option (the kernel prints "65536k"; users write "8g")."""
    for opt in options.split(","):
        if opt.startswith("size="):
            value = opt[5:].lower()
            scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(value[-1:], 1)
            digits = value[:-1] if scale != 1 else value
            return int(digits) * scale if digits.isdigit() else None
    return None


def shm_mount(proc_root: Path) -> tuple[str, str] | None:
    """``(fstype, super options)`` of the mount at /dev/shm; the last one shadows the others."""
    text = _read(proc_root / "self" / "mountinfo")
    found = None
    for line in (text or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3 and _unescape(fields[4]) == "/dev/shm":
            found = (tail[0], tail[2])
    return found


def shm_check(proc_root: Path, dev_root: Path) -> Check:
    """NCCL and MPI put their intra-node buffers in /dev/shm; Docker's default is 64M."""
    title = "/dev/shm size"
    mount = shm_mount(proc_root)
    size = _size_option(mount[1]) if mount is not None and mount[0] == "tmpfs" else None
    source = "mountinfo"
    if size is None:
        try:
            st = os.statvfs(dev_root / "shm")
        except OSError as exc:
            return Check(SUBJECT, title, False, f"no /dev/shm ({exc.strerror})", SHM_FIX)
        size, source = st.f_frsize * st.f_blocks, "statvfs"
    if size < MIN_SHM_BYTES:
        return Check(SUBJECT, title, False,
                     f"{_human_bytes(size)} ({source}): below 1 GiB", SHM_FIX)
    return Check(SUBJECT, title, True, f"{_human_bytes(size)} ({source})")


def main(argv: list[str] | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """``rdma-hca check ARGV...`` as a function: returns the exit status."""
    args = parse_command("check", add_parser, argv)
    if isinstance(args, int):
        return args
    try:
        return run(args, env=env)
    except ConfigError as exc:
        print(f"rdma-hca check: {exc}", file=sys.stderr)
        return EXIT_USAGE
