"""Every setting of the daemon, declared once.

A :class:`Setting` holds the YAML key, the environment variable(s), the flag, the type,
the allowed range or choices, the default and a one-line help. From this table come the
flags of ``serve`` (and of the subcommands that share settings), the environment layer,
validation (``rdma_hca.settings.coerce``), the table in docs/configuration.md and the test
that holds the chart's values.schema.json to the same names, types and ranges.

Naming rules, so that nobody has to guess: the environment variable is ``RDMA_HCA_`` and the
key in upper snake case (``cdi.specDir`` -> ``RDMA_HCA_CDI_SPEC_DIR``); the flag is the key in
kebab case (``--cdi-spec-dir``), and a group's ``enabled`` switch is the group's name
(``cdi.enabled`` -> ``--cdi`` / ``--no-cdi``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from rdma_hca.kit.text import markdown_table
from rdma_hca.settings.model import (
    DEFAULT_API_BURST,
    DEFAULT_API_QPS,
    DEFAULT_CLAIM_API_BURST,
    DEFAULT_CLAIM_API_QPS,
    DEFAULT_DRA_DRIVER_NAME,
    DEFAULT_DRA_RESYNC_SECONDS,
    DEFAULT_DRA_START_JITTER_SECONDS,
    DEFAULT_FLAP_HOLD_SECONDS,
    DEFAULT_HEALTH_POLL_SECONDS,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    DEFAULT_KUBELET_ROOT,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_RDMA_HCA_MAX,
    DEFAULT_READ_DEADLINE_SECONDS,
    DEFAULT_RESEND_SECONDS,
    DEFAULT_RESOURCE_NAME,
    DEFAULT_STATUS_RETRY_AFTER_MAX_SECONDS,
    ENV_PREFIX,
    DeviceMetadata,
    LogFormat,
    LogLevel,
    Mode,
    NcclEnv,
    UnhealthyWhen,
)


class Kind(StrEnum):
    BOOL = "boolean"
    INT = "integer"
    FLOAT = "number"
    STR = "string"
    ENUM = "enum"
    PATH = "path"
    ADDRESS = "address"
    RESOURCE_NAME = "resource name"
    DNS_NAME = "DNS subdomain"
    SELECTORS = "selectors"
    POOLS = "pools"
    BANDWIDTH = "bandwidth"  # a quantity of bits per second, in whole BANDWIDTH_STEPs


class Scope(StrEnum):
    TOP = "top"  # one value for the daemon
    POOL = "pool"  # a default for every pool, which a pool may override
    MACHINE = "machine"  # where to look on this machine: flags and environment, never the file


@dataclass(frozen=True, slots=True)
class Setting:
    key: str  # YAML key; dotted for a key inside a group (cdi.specDir)
    kind: Kind
    default: object
    help: str
    attr: str  # where the value lands: a Settings attribute, "group.attr" or a PoolConfig one
    scope: Scope = Scope.TOP
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    zero_off: bool = False  # 0 turns the feature off (outside the range)
    env: tuple[str, ...] = ()  # first wins
    flag: str | None = None
    shared: bool = False  # the tools (discover, doctor --node, check) honour it too
    default_text: str | None = None  # how the docs show a default that is derived
    max_length: int | None = None  # for names
    absolute: bool = False  # a path that must be absolute
    enum: type[StrEnum] | None = None  # the type an ENUM setting's value has, whatever layer
    aliases: tuple[tuple[str, str], ...] = ()  # older spellings of an enum's choices

    @property
    def in_file(self) -> bool:
        return self.scope is not Scope.MACHINE

    @property
    def dest(self) -> str:
        """The argparse destination of the flag."""
        assert self.flag is not None
        return self.flag.removeprefix("--").replace("-", "_")


def env_name(key: str) -> str:
    return ENV_PREFIX + re.sub(r"([A-Z])", r"_\1", key).replace(".", "_").upper()


def flag_name(key: str) -> str:
    key = key.removesuffix(".enabled")
    return "--" + re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), key).replace(".", "-")


def _s(key: str, kind: Kind, default: object, help: str, *, attr: str | None = None,
       flag: bool = True, env: bool = True, extra_env: Sequence[str] = (),
       enum: type[StrEnum] | None = None, **kw: object) -> Setting:
    if enum is not None:
        kw.update(enum=enum, choices=_choices(enum))
    if attr is None:
        group, _, name = key.rpartition(".")
        snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)
        attr = f"{group}.{snake}" if group else snake
    return Setting(
        key=key, kind=kind, default=default, help=help, attr=attr,
        env=((env_name(key),) if env else ()) + tuple(extra_env),
        flag=flag_name(key) if flag else None,
        **kw,  # type: ignore[arg-type]
    )


def _choices(enum: type[StrEnum]) -> tuple[str, ...]:
    return tuple(e.value for e in enum)


SETTINGS: tuple[Setting, ...] = (
    # --- what a pool offers (top-level values are defaults for every pool) ---------------
    _s("resourceName", Kind.RESOURCE_NAME, DEFAULT_RESOURCE_NAME,
       "the extended resource name pods ask for",
       scope=Scope.POOL),
    _s("rdmaHcaMax", Kind.INT, DEFAULT_RDMA_HCA_MAX,
       "device IDs a shared pool advertises: how many pods may use its HCAs at once",
       scope=Scope.POOL, minimum=1, maximum=100000),
    _s("mode", Kind.ENUM, Mode.SHARED.value,
       "shared: every pod gets every HCA of the pool; exclusive: one device per HCA",
       scope=Scope.POOL, enum=Mode),
    _s("unhealthyWhen", Kind.ENUM, UnhealthyWhen.ANY.value,
       "the pool is Unhealthy while any (or all) of its HCAs has no port up",
       scope=Scope.POOL, enum=UnhealthyWhen),
    _s("selectors", Kind.SELECTORS, None,
       "which HCAs the pool holds (see Selectors); none given: every HCA",
       scope=Scope.POOL, flag=False, env=False, default_text="all HCAs"),
    _s("pools", Kind.POOLS, None,
       "several pools, each with its own resourceName and any of the pool keys above",
       flag=False, env=False, default_text="one pool from the keys above"),
    _s("devicePlugin.enabled", Kind.BOOL, True,
       "serve the device-plugin pools; false runs the DRA driver alone",
       attr="device_plugin_enabled"),
    # --- what Allocate hands out -------------------------------------------------------
    _s("nonHostNetwork", Kind.BOOL, False,
       "allow RDMA for non-hostNetwork pods (needs an IPv6 compute network)"),
    _s("ncclEnv", Kind.ENUM, NcclEnv.AUTO.value,
       "NCCL/UCX variables for the allocated HCAs (docs/nccl.md): auto: all derived from "
       "the node; hca: NCCL_IB_HCA only; off: none (true and false still mean hca and off)",
       enum=NcclEnv, aliases=(("true", "hca"), ("false", "off"))),
    _s("cdi.enabled", Kind.BOOL, False,
       "Allocate returns CDI device names; the daemon writes its CDI spec"),
    _s("cdi.specDir", Kind.PATH, "/var/run/cdi", "where the CDI spec is written",
       absolute=True),
    # --- Dynamic Resource Allocation -----------------------------------------------------
    _s("dra.enabled", Kind.BOOL, False,
       "also (or only) serve the HCAs through Dynamic Resource Allocation"),
    _s("dra.driverName", Kind.DNS_NAME, DEFAULT_DRA_DRIVER_NAME,
       "the DRA driver's name, as ResourceSlices and DeviceClasses name it",
       max_length=63),
    _s("dra.mode", Kind.ENUM, Mode.SHARED.value,
       "shared: a device may be in several claims at once (allowMultipleAllocations); "
       "exclusive: in one claim at a time", enum=Mode),
    _s("dra.selectors", Kind.SELECTORS, None,
       "which HCAs the DRA driver publishes (same keys as a pool's selectors)",
       flag=False, env=False, default_text="all HCAs"),
    _s("dra.apiQps", Kind.FLOAT, DEFAULT_API_QPS,
       "requests a second the driver sends the API server on its own at most (slice "
       "writes first, then claim status writes), after its burst (client-go's default)",
       minimum=0.1, maximum=1000),
    _s("dra.apiBurst", Kind.INT, DEFAULT_API_BURST,
       "requests the driver may send the API server at once before apiQps applies",
       minimum=1, maximum=1000),
    _s("dra.claimApiQps", Kind.FLOAT, DEFAULT_CLAIM_API_QPS,
       "claim reads a second NodePrepareResources sends at most, after claimApiBurst, "
       "never behind the driver's own requests (the kubelet's own client budget)",
       minimum=0.1, maximum=1000),
    _s("dra.claimApiBurst", Kind.INT, DEFAULT_CLAIM_API_BURST,
       "claim reads NodePrepareResources may send at once before claimApiQps applies",
       minimum=1, maximum=1000),
    _s("dra.resyncSeconds", Kind.FLOAT, DEFAULT_DRA_RESYNC_SECONDS,
       "how often the driver checks the API server's copy of its slices (one LIST, "
       "jittered by 20%), seconds", minimum=5, maximum=86400, zero_off=True),
    _s("dra.startJitterSeconds", Kind.FLOAT, DEFAULT_DRA_START_JITTER_SECONDS,
       "the first publish waits a random part of this, so a fleet restarting at once "
       "spreads out, seconds", minimum=0, maximum=600),
    _s("dra.statusRetryAfterMaxSeconds", Kind.FLOAT, DEFAULT_STATUS_RETRY_AFTER_MAX_SECONDS,
       "a claim status write the API server answers with Retry-After waits that long, at "
       "most this, seconds", minimum=1, maximum=3600),
    _s("dra.deviceMetadata", Kind.ENUM, DeviceMetadata.OFF.value,
       "per-claim device metadata files (KEP-5304, docs/dra.md) mounted into the claim's "
       "containers: v1alpha1 (what Kubernetes 1.36 reads), v1beta1 (v1beta1, then "
       "v1alpha1), off: none", enum=DeviceMetadata,
       aliases=(("false", "off"),)),  # YAML reads a bare off as false
    _s("dra.nodeDevice", Kind.BOOL, True,
       "in shared mode, publish the node-wide device all-hcas (every usable HCA, what "
       "rdma/hca gives through DRA's extended class); false: none, and the extended class "
       "gives one HCA per unit"),
    _s("dra.defaultBandwidth", Kind.BANDWIDTH, 0,
       "the bandwidth a claim that asks for none holds of each HCA (the request policy's "
       "default; an HCA slower than it is held whole), bits per second, e.g. 100G"),
    # --- Kubernetes Events -----------------------------------------------------------------
    _s("events.enabled", Kind.BOOL, False,
       "record Kubernetes Events on the Node when an HCA's port goes down or back or its "
       "device nodes go (needs API credentials; the DRA driver records its Events whatever "
       "this says)", attr="events_enabled"),
    # --- the fabric ----------------------------------------------------------------------
    _s("fabric.lldp", Kind.BOOL, False,
       "listen for LLDP on the RoCE ports to learn each port's switch (DRA attributes, "
       "node label, metrics; docs/fabric.md); needs the CAP_NET_RAW capability"),
    # --- timing ------------------------------------------------------------------------
    _s("healthPollSeconds", Kind.FLOAT, DEFAULT_HEALTH_POLL_SECONDS,
       "how often port state is read from sysfs, seconds", minimum=0.05, maximum=60),
    _s("flapHoldSeconds", Kind.FLOAT, DEFAULT_FLAP_HOLD_SECONDS,
       "an HCA whose ports changed 4 times within 10 s counts as down (Unhealthy, tainted) "
       "until a port has been up this long, seconds", minimum=1, maximum=600),
    _s("resendSeconds", Kind.FLOAT, DEFAULT_RESEND_SECONDS,
       "the device list is sent to the kubelet again this often, seconds",
       minimum=1, maximum=3600, zero_off=True),
    _s("readDeadlineSeconds", Kind.FLOAT, DEFAULT_READ_DEADLINE_SECONDS,
       "deadline of each read of the machine (sysfs, /dev), seconds",
       minimum=0.1, maximum=60, shared=True),
    # --- HTTP and logs -----------------------------------------------------------------
    _s("metricsAddress", Kind.ADDRESS, DEFAULT_METRICS_ADDRESS,
       "HOST:PORT or :PORT of /metrics, /healthz and /readyz; empty turns them off"),
    _s("http.maxConnections", Kind.INT, DEFAULT_HTTP_MAX_CONNECTIONS,
       "concurrent HTTP connections; more are answered 503 at once",
       minimum=1, maximum=4096),
    _s("logFormat", Kind.ENUM, LogFormat.TEXT.value, "log line format",
       enum=LogFormat),
    _s("logLevel", Kind.ENUM, LogLevel.INFO.value, "least severe level logged",
       enum=LogLevel),
    # --- where things are on this machine (flags and environment only) -------------------
    _s("sysfsRoot", Kind.PATH, "/sys", "where sysfs is mounted",
       scope=Scope.MACHINE, shared=True),
    _s("devRoot", Kind.PATH, "/dev", "where the device nodes are",
       scope=Scope.MACHINE, shared=True),
    _s("kubeletRoot", Kind.PATH, DEFAULT_KUBELET_ROOT,
       "the kubelet's root directory; device-plugins, plugins_registry and plugins are in it",
       scope=Scope.MACHINE, shared=True),
    _s("kubeletDir", Kind.PATH, None,
       "the kubelet's device-plugins directory, when it is not <kubeletRoot>/device-plugins",
       scope=Scope.MACHINE, shared=True, default_text="<kubeletRoot>/device-plugins"),
    _s("nodeName", Kind.DNS_NAME, "",
       "this node's name (the chart sets NODE_NAME from the pod's spec.nodeName)",
       scope=Scope.MACHINE, extra_env=("NODE_NAME",), default_text="none",
       max_length=253),
    _s("podUid", Kind.DNS_NAME, "",
       "this pod's UID (the chart sets POD_UID from metadata.uid): the DRA sockets carry it, "
       "so two instances can run side by side in a rolling update",
       scope=Scope.MACHINE, extra_env=("POD_UID",), default_text="none", max_length=63),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}
POOL_KEYS: tuple[str, ...] = tuple(s.key for s in SETTINGS if s.scope is Scope.POOL)
# The YAML keys of a selectors mapping -> Selectors attributes.
SELECTOR_KEYS: dict[str, str] = {
    "names": "names",
    "drivers": "drivers",
    "linkLayers": "link_layers",
    "netdevs": "netdevs",
    "pciVendors": "pci_vendors",
    "pciDevices": "pci_devices",
}
LINK_LAYERS = ("Ethernet", "InfiniBand")
# Variables that are ours but not settings: Allocate sets RDMA_HCA_DEVICES in containers.
OTHER_ENV = {ENV_PREFIX + "CONFIG": "the config file", ENV_PREFIX + "DEVICES": "set by Allocate"}


def file_groups() -> dict[str, tuple[str, ...]]:
    """Group name -> the keys allowed inside it in the file (``cdi`` -> enabled, specDir)."""
    groups: dict[str, list[str]] = {}
    for s in SETTINGS:
        if s.in_file and "." in s.key:
            group, _, sub = s.key.partition(".")
            groups.setdefault(group, []).append(sub)
    return {g: tuple(subs) for g, subs in groups.items()}


def top_file_keys() -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.key.partition(".")[0] for s in SETTINGS if s.in_file))


def known_env() -> set[str]:
    return {e for s in SETTINGS for e in s.env if e.startswith(ENV_PREFIX)} | set(OTHER_ENV)


# --- flags -------------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
              settings: Iterable[Setting] = SETTINGS) -> None:
    """One flag per declared setting that has one; every default is None ("not given"), so
    the environment and the file below still apply and errors name the flag."""
    for s in settings:
        if s.flag is None:
            continue
        # Choices show in the metavar and a switch has --no-: no need to repeat them.
        allowed = "" if s.kind in (Kind.BOOL, Kind.ENUM) else allowed_text(s) + "; "
        text = f"{s.help} ({allowed}default {default_text(s)}; env {s.env[0]})"
        text = text.replace("%", "%%")
        if s.kind is Kind.BOOL:
            parser.add_argument(s.flag, dest=s.dest, action=argparse.BooleanOptionalAction,
                                default=None, help=text)
        else:
            parser.add_argument(s.flag, dest=s.dest, default=None, help=text,
                                metavar=_metavar(s))


def flag_values(namespace: argparse.Namespace) -> dict[str, object]:
    """YAML key -> value of every declared flag present on ``namespace`` (None: not given)."""
    return {s.key: getattr(namespace, s.dest) for s in SETTINGS
            if s.flag is not None and hasattr(namespace, s.dest)}


def flags_in(argv: Sequence[str], settings: Iterable[Setting]) -> dict[str, object]:
    """YAML key -> value of the flags of ``settings`` in ``argv``, a command line of serve's
    that may hold other flags, parsed as serve's parser parses them (None: not given).

    A flag serve would refuse raises :class:`argparse.ArgumentError` with argparse's words.
    """
    chosen = list(settings)
    # Abbreviations off: with only some flags known, a prefix could pick the wrong one.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    add_flags(parser, chosen)
    given, _ = parser.parse_known_args(list(argv))
    keys = {s.key for s in chosen}
    return {k: v for k, v in flag_values(given).items() if k in keys}


def _metavar(s: Setting) -> str:
    if s.kind is Kind.ENUM:
        return "{" + ",".join(s.choices) + "}"
    return {Kind.INT: "N", Kind.FLOAT: "SECONDS", Kind.PATH: "DIR",
            Kind.ADDRESS: "HOST:PORT", Kind.BANDWIDTH: "QUANTITY"}.get(s.kind, "NAME")


# --- docs --------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    return f"{x:g}"


def allowed_text(s: Setting) -> str:
    if s.kind is Kind.BOOL:
        return "true or false"
    if s.kind is Kind.ENUM:
        return ", ".join(s.choices[:-1]) + " or " + s.choices[-1]
    if s.kind in (Kind.INT, Kind.FLOAT):
        what = "an integer" if s.kind is Kind.INT else "a number"
        text = f"{what} from {_num(s.minimum)} to {_num(s.maximum)}"
        return text + (", or 0 to turn it off" if s.zero_off else "")
    return {
        Kind.PATH: "an absolute directory path" if s.absolute else "a directory path",
        Kind.ADDRESS: "HOST:PORT, :PORT (port 1-65535) or empty",
        Kind.RESOURCE_NAME: "domain/name, not in the kubernetes.io domain",
        Kind.DNS_NAME: "a DNS subdomain (lower case letters, digits, '-', '.') of at most "
                       f"{s.max_length} characters",
        Kind.SELECTORS: "a mapping of selector lists",
        Kind.POOLS: "a non-empty list of pools",
        Kind.BANDWIDTH: "a quantity of bits per second in whole G (e.g. 50G, 1.6T), or 0",
        Kind.STR: "a string",
    }[s.kind]


def default_text(s: Setting) -> str:
    if s.default_text is not None:
        return s.default_text
    if isinstance(s.default, bool):
        return "true" if s.default else "false"
    if isinstance(s.default, float):
        return _num(s.default)
    return str(s.default) if s.default != "" else "empty"


def docs_table() -> str:
    """The settings table of docs/configuration.md, generated from the declaration."""
    rows = []
    for s in SETTINGS:
        rows.append([
            f"`{s.key}`" + ("" if s.in_file else " (not in the file)"),
            f"`{s.flag}`" if s.flag else "–",
            ", ".join(f"`{e}`" for e in s.env) or "–",
            f"`{default_text(s)}`",
            allowed_text(s),
            s.help,
        ])
    return markdown_table(["key (YAML)", "flag", "environment", "default", "allowed", "what"],
                          rows)


TABLE_BEGIN = "<!-- settings table: generated by scripts/gen-config-docs.py; do not edit -->"
TABLE_END = "<!-- end of settings table -->"


def with_docs_table(page: str) -> str:
    """``page`` (docs/configuration.md) with the text between the markers regenerated."""
    head, sep, rest = page.partition(TABLE_BEGIN)
    _, sep2, tail = rest.partition(TABLE_END)
    if not sep or not sep2:
        raise ValueError(f"the page has no {TABLE_BEGIN!r} ... {TABLE_END!r} markers")
    return f"{head}{TABLE_BEGIN}\n{docs_table()}\n{TABLE_END}{tail}"
