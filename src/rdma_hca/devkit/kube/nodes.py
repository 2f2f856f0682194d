"""Nodes patched as the real API server patches them: a JSON (or strategic) merge patch of
the object, its metadata validated as ``ValidateObjectMeta`` does, a ``resourceVersion``
in the patch a precondition, and the status left alone (it is a subresource).

The limits are upstream's (k8s.io/apimachinery validation): a label value at most 63
characters, alphanumeric at both ends with ``-_.`` inside; a label or annotation key a
qualified name (an optional DNS subdomain prefix of at most 253 and ``/``, then a name of
at most 63, alphanumeric at both ends); all annotations of an object together (keys and
values) at most 256 KiB (``TotalAnnotationSizeLimitB``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from rdma_hca.devkit.kube.errors import HttpError
from rdma_hca.devkit.kube.events import merge_patch
from rdma_hca.devkit.kube.validation import DNS_SUBDOMAIN, Invalid

NODE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
MAX_LABEL_VALUE = 63
MAX_NAME_PART = 63
MAX_PREFIX = 253
MAX_ANNOTATIONS_BYTES = 256 * 1024

_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str) or not key:
        return "name part must be non-empty"
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > MAX_PREFIX or not DNS_SUBDOMAIN.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case " \
               "alphanumeric characters, '-' or '.'"
    if len(name) > MAX_NAME_PART:
        return f"name part must be no more than {MAX_NAME_PART} characters"
    if not _NAME_PART.match(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', and " \
               "must start and end with an alphanumeric character"
    return None


def check_labels(labels: object) -> None:
    if not isinstance(labels, dict):
        raise Invalid("metadata.labels: Invalid value: must be a map of strings")
    for key, value in labels.items():
        problem = _key_problem(key)
        if problem:
            raise Invalid(f"metadata.labels: Invalid value: {key!r}: {problem}")
        if not isinstance(value, str):
            raise Invalid(f"metadata.labels: Invalid value: {value!r}: must be a string")
        if len(value) > MAX_LABEL_VALUE:
            raise Invalid(f"metadata.labels: Invalid value: {value!r}: must be no more "
                          f"than {MAX_LABEL_VALUE} characters")
        if not _LABEL_VALUE.match(value):
            raise Invalid(f"metadata.labels: Invalid value: {value!r}: a valid label must "
                          "be an empty string or consist of alphanumeric characters, '-', "
                          "'_' or '.', and must start and end with an alphanumeric "
                          "character")


def check_annotations(annotations: object) -> None:
    if not isinstance(annotations, dict):
        raise Invalid("metadata.annotations: Invalid value: must be a map of strings")
    total = 0
    for key, value in annotations.items():
        problem = _key_problem(key)
        if problem:
            raise Invalid(f"metadata.annotations: Invalid value: {key!r}: {problem}")
        if not isinstance(value, str):
            raise Invalid(f"metadata.annotations: Invalid value: {value!r}: must be a string")
        total += len(key) + len(value)
    if total > MAX_ANNOTATIONS_BYTES:
        raise Invalid(f"metadata.annotations: Too long: must have at most "
                      f"{MAX_ANNOTATIONS_BYTES} bytes")


def patch_node(old: dict[str, Any], patch: dict[str, Any], content_type: str,
               next_rv: Callable[[], str]) -> dict[str, Any]:
    """The Node after ``patch``; raises what the real server answers for a bad one."""
    if content_type.split(";")[0].strip() not in NODE_PATCHES:
        raise HttpError(415, "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted media "
                        f"types include: application/json-patch+json, "
                        f"{', '.join(NODE_PATCHES)}, application/apply-patch+yaml")
    name = old["metadata"]["name"]
    wanted = (patch.get("metadata") or {}).get("resourceVersion") \
        if isinstance(patch.get("metadata"), dict) else None
    if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
        raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": '
                        "the object has been modified; please apply your changes to the "
                        "latest version and try again", {"name": name, "kind": "nodes"})
    new: dict[str, Any] = merge_patch(old, patch)
    if not isinstance(new.get("metadata"), dict):
        raise Invalid("metadata: Required value")
    meta = new["metadata"]
    for key in ("name", "uid", "creationTimestamp"):
        if meta.get(key) != old["metadata"].get(key):
            raise Invalid(f"metadata.{key}: Invalid value: {meta.get(key)!r}: field is "
                          "immutable")
    check_labels(meta.get("labels") or {})
    check_annotations(meta.get("annotations") or {})
    new["status"] = copy.deepcopy(old.get("status"))  # a subresource: not written here
    new["apiVersion"], new["kind"] = "v1", "Node"
    meta["resourceVersion"] = old["metadata"]["resourceVersion"]
    for key in ("labels", "annotations"):
        if key in meta and not meta[key]:
            del meta[key]
    if new != old:
        meta["resourceVersion"] = next_rv()
    return new
