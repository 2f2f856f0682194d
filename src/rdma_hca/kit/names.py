"""Kubernetes name rules the daemon, the tools and the devkit all check."""

from __future__ import annotations

import re

DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"^{DNS_LABEL}(\.{DNS_LABEL})*$")
QUALIFIED_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_dns_subdomain(name: str) -> bool:
    """RFC 1123 subdomain as Kubernetes checks it: lower case, at most 253 characters."""
    return 0 < len(name) <= 253 and DNS_SUBDOMAIN.match(name) is not None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None when it is.

    The kubelet's rules (``IsExtendedResourceName``): ``domain/name`` outside the
    kubernetes.io domains, the domain a DNS subdomain, not starting with ``requests.``,
    the name part a qualified name of at most 63 characters.
    """
    if name.count("/") != 1:
        return "it must be <domain>/<name>, e.g. rdma/hca"
    domain, short = name.split("/")
    if not is_dns_subdomain(domain):
        return "the part before '/' must be a DNS subdomain (lower case letters, digits, '-', '.')"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is reserved for Kubernetes itself"
    if domain.startswith("requests."):
        return "a name starting with 'requests.' is reserved for quotas"
    if not short or len(short) > 63 or not QUALIFIED_NAME_PART.match(short):
        return (
            "the part after '/' must be 1-63 characters of letters, digits, '-', '_', '.',"
            " starting and ending with a letter or digit"
        )
    return None
