"""Kubernetes name rules in one place."""

from __future__ import annotations

import pytest

from rdma_hca.kit.names import is_dns_subdomain, resource_name_problem


@pytest.mark.parametrize("name", ["rdma/hca", "example.com/rdma", "a.b-c.io/x_y.z",
                                  "rdma/" + "a" * 63])
def test_valid_resource_names(name: str) -> None:
    assert resource_name_problem(name) is None


@pytest.mark.parametrize(("name", "fragment"), [
    ("hca", "<domain>/<name>"),
    ("a/b/c", "<domain>/<name>"),
    ("Rdma/hca", "DNS subdomain"),
    ("kubernetes.io/hca", "reserved"),
    ("node.kubernetes.io/hca", "reserved"),
    ("requests.rdma/hca", "quotas"),
    ("rdma/-hca", "after '/'"),
    ("rdma/" + "a" * 64, "1-63"),
])
def test_invalid_resource_names(name: str, fragment: str) -> None:
    why = resource_name_problem(name)
    assert why is not None and fragment in why


def test_dns_subdomain() -> None:
    assert is_dns_subdomain("rdma-hca.io")
    assert not is_dns_subdomain("")
    assert not is_dns_subdomain("a" * 254)
    assert not is_dns_subdomain("Under_Score")
