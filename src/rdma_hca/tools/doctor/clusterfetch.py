"""The reads of the cluster view: the DaemonSet, every node, its pods and the DRA driver's
ResourceSlices and DeviceClasses, parsed into the doctor's records where DRA's are concerned.

A refusal (401, 403) is an :class:`AccessError` that says which permission is missing; the
DRA reads fail softly (no resource.k8s.io/v1, RBAC, a server error): the rest of the
report still stands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rdma_hca.contract.dra import GROUP
from rdma_hca.kube.errors import ApiError, KubeError, NotFoundError
from rdma_hca.tools.doctor import slices as dra
from rdma_hca.tools.doctor.clusterdata import ClusterData
from rdma_hca.tools.doctor.draobjects import DeviceClass, parse_device_class, parse_slice
from rdma_hca.tools.doctor.hcaparams import ParamsData, refused
from rdma_hca.tools.doctor.kubeapi import KubeClient
from rdma_hca.tools.doctor.workloads import Pod, parse_daemonset, parse_node, parse_pod

T = TypeVar("T")

RBAC_FIX = (
    "kubectl create clusterrole rdma-hca-doctor --verb=get,list "
    "--resource=nodes,pods,daemonsets.apps && kubectl create clusterrolebinding "
    "rdma-hca-doctor --clusterrole=rdma-hca-doctor --user=<you>"
)


class AccessError(KubeError):
    """401/403: the credentials work at the network level but are refused."""


def fetch(
    client: KubeClient, namespace: str, name: str, driver: str | None = dra.DEFAULT_DRIVER
) -> ClusterData:
    """Read the DaemonSet, every node, the DaemonSet's pods and (unless ``driver`` is None)
    the DRA driver's ResourceSlices."""
    found = _read(client, lambda: client.daemonset(namespace, name), "get", "daemonsets",
                  "apps", namespace)
    daemonset = parse_daemonset(found) if found is not None else None
    nodes = [parse_node(n) for n in _read(client, client.nodes, "list", "nodes", "", None)]
    pods: list[Pod] = []
    if daemonset is not None:
        selector = daemonset.selector
        pods = [parse_pod(p) for p in _read(
            client, lambda: client.pods(namespace, selector), "list", "pods", "", namespace)]
    dra_data = fetch_dra(client, driver) if driver is not None else None
    params = (fetch_params(client, dra_data.driver)
              if dra_data is not None and dra_data.slices is not None else None)
    return ClusterData(namespace, name, daemonset, nodes, pods, dra_data, params)


def fetch_params(client: KubeClient, driver: str) -> ParamsData:
    """The claims and templates whose parameters for ``driver`` it would refuse; a read
    that fails is a note, the rest of the report stands."""
    try:
        claims = _read(client, client.resource_claims, "list", "resourceclaims", GROUP, None)
        templates = _read(client, client.resource_claim_templates, "list",
                          "resourceclaimtemplates", GROUP, None)
    except AccessError as exc:
        if not isinstance(exc.__cause__, ApiError) or exc.__cause__.status != 403:
            raise
        return ParamsData(error=(
            f"RBAC denied listing claims ({exc.__cause__}): doctor needs list on "
            f"resourceclaims.{GROUP} and resourceclaimtemplates.{GROUP}, e.g. kubectl "
            "create clusterrole rdma-hca-doctor-claims --verb=list --resource=resourceclaims."
            f"{GROUP},resourceclaimtemplates.{GROUP} && kubectl create clusterrolebinding "
            "rdma-hca-doctor-claims --clusterrole=rdma-hca-doctor-claims --user=<you>"))
    except ApiError as exc:
        return ParamsData(error=str(exc))
    return ParamsData(refused(claims, templates, driver))


def fetch_dra(client: KubeClient, driver: str) -> dra.DraData:
    """The driver's slices (one list, all nodes, so stale ones show too); the DeviceClasses
    when no slice exists, to tell "DRA not in use" from "no node publishes", and when a
    slice holds the node-wide device, to find the classes that would match it unawares.

    404 means the API server has no resource.k8s.io/v1 and 403 that we may not look: both
    are reported on one line instead of failing the whole doctor."""
    try:
        slices = [parse_slice(s) for s in _read(
            client, lambda: client.resource_slices(driver), "list", "resourceslices", GROUP,
            None)]
    except NotFoundError:
        return dra.DraData(driver, available=False, slices=None)
    except AccessError as exc:
        if not isinstance(exc.__cause__, ApiError) or exc.__cause__.status != 403:
            raise
        return dra.DraData(driver, available=True, slices=None, denied=_denied(exc.__cause__))
    except ApiError as exc:  # e.g. 500: the DRA part fails, the rest is still reported
        return dra.DraData(driver, available=True, slices=None, error=str(exc))
    if slices:
        if not dra.has_node_wide(slices, driver):
            return dra.DraData(driver, available=True, slices=slices)
        try:
            found = _read(client, client.device_classes, "list", "deviceclasses", GROUP, None)
        except (AccessError, ApiError) as exc:
            if isinstance(exc, AccessError) and not (
                    isinstance(exc.__cause__, ApiError) and exc.__cause__.status == 403):
                raise
            # Only the class check is lost: the slices are judged all the same.
            return dra.DraData(driver, available=True, slices=slices)
        return dra.DraData(driver, available=True, slices=slices,
                           device_classes=_selecting(found, driver))
    try:
        classes = _read(client, client.device_classes, "list", "deviceclasses", GROUP,
                        None)
    except NotFoundError:
        classes = []
    except AccessError as exc:
        if not isinstance(exc.__cause__, ApiError) or exc.__cause__.status != 403:
            raise
        return dra.DraData(driver, available=True, slices=slices, device_classes=None)
    return dra.DraData(driver, available=True, slices=slices,
                       device_classes=_selecting(classes, driver))


def _selecting(classes: list[dict[str, Any]], driver: str) -> list[DeviceClass]:
    parsed = (parse_device_class(c) for c in classes)
    return [c for c in parsed if dra.selects_driver(c, driver)]


def _denied(exc: ApiError) -> str:
    return f"RBAC denied list resourceslices.{GROUP} at cluster scope ({exc})"


def _read(
    client: KubeClient,
    request: Callable[[], T],
    verb: str,
    resource: str,
    group: str,
    namespace: str | None,
) -> T:
    try:
        return request()
    except ApiError as exc:
        if exc.status == 401:
            raise AccessError(
                f"the API server {client.server} rejected our credentials (HTTP 401 "
                "Unauthorized): the token or client certificate is wrong or expired; "
                "get a fresh kubeconfig"
            ) from exc
        if exc.status == 403:
            scope = f"in namespace {namespace}" if namespace else "at cluster scope"
            full = f"{resource}.{group}" if group else resource
            raise AccessError(
                f"RBAC denied {verb} {full} {scope} ({exc}): rdma-hca doctor needs get/list "
                f"on nodes, pods and daemonsets.apps, e.g. {RBAC_FIX}"
            ) from exc
        raise


