"""The one credential search: its order, and messages that name only what the calling
command accepts (serve has no credential flags; doctor has --kubeconfig and --context)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rdma_hca.daemon.dra.kubeapi import SERVE_CREDENTIALS
from rdma_hca.devkit.kube.apiserver import write_kubeconfig
from rdma_hca.kube.credentials import NO_FLAGS, CredentialSearch, load_credentials
from rdma_hca.kube.errors import KubeconfigError
from rdma_hca.tools.doctor.kubeapi import CREDENTIALS as DOCTOR_CREDENTIALS

FLAGS = ("--kubeconfig", "--context")


def service_account(root: Path) -> None:
    sa = root / "var/run/secrets/kubernetes.io/serviceaccount"
    sa.mkdir(parents=True)
    (sa / "token").write_text("sa-token\n")


def refusal(tmp_path: Path, accepts: CredentialSearch, kubeconfig: str | None = None,
            env: dict[str, str] | None = None) -> str:
    with pytest.raises(KubeconfigError) as err:
        load_credentials(kubeconfig=kubeconfig, context=None, env=env or {},
                         home=tmp_path / "home", in_cluster_root=tmp_path, accepts=accepts)
    text = str(err.value)
    assert "\n" not in text
    return text


def broken_kubeconfig(tmp_path: Path, broken: str) -> str:
    """A kubeconfig path that is missing, not YAML, or without a current-context."""
    path = tmp_path / "kubeconfig"
    if broken == "yaml":
        path.write_text("clusters: [unclosed\n")
    elif broken == "no-context":
        path.write_text(yaml.safe_dump({"clusters": []}))
    return str(path)


def test_nothing_found_names_what_serve_accepts_in_its_order(tmp_path: Path) -> None:
    text = refusal(tmp_path, SERVE_CREDENTIALS)
    assert text == (
        "no usable API server credentials: tried the in-cluster service account "
        "(KUBERNETES_SERVICE_HOST is not set), then $KUBECONFIG (not set), then "
        f"{tmp_path / 'home' / '.kube' / 'config'} (missing): run it in a pod with its service "
        "account token mounted (the chart does when dra.enabled is true), or set KUBECONFIG to "
        "a kubeconfig file")


def test_nothing_found_names_doctors_flags_in_kubectls_order(tmp_path: Path) -> None:
    text = refusal(tmp_path, DOCTOR_CREDENTIALS, env={"KUBECONFIG": "/no/a:/no/b"})
    assert text == (
        "no usable API server credentials: tried --kubeconfig (not given), then "
        "KUBECONFIG=/no/a:/no/b (no such file), then "
        f"{tmp_path / 'home' / '.kube' / 'config'} (missing), then the in-cluster service "
        "account (KUBERNETES_SERVICE_HOST is not set): pass --kubeconfig FILE or set "
        "KUBECONFIG to a kubeconfig file")


@pytest.mark.parametrize("accepts", [SERVE_CREDENTIALS, NO_FLAGS], ids=["serve", "no-flags"])
@pytest.mark.parametrize("broken", ["missing", "yaml", "no-context", "nothing"])
def test_a_command_without_flags_is_never_told_to_pass_one(
        tmp_path: Path, accepts: CredentialSearch, broken: str) -> None:
    given = None if broken == "nothing" else broken_kubeconfig(tmp_path, broken)
    text = refusal(tmp_path, accepts, given)
    assert not any(flag in text for flag in FLAGS), text


@pytest.mark.parametrize(("broken", "hint"), [
    ("yaml", "or pass another with --kubeconfig"),
    ("no-context", "pass --context NAME or run kubectl config use-context NAME"),
    ("missing", "pass an existing file to --kubeconfig"),
])
def test_doctor_is_told_its_flags(tmp_path: Path, broken: str, hint: str) -> None:
    assert refusal(tmp_path, DOCTOR_CREDENTIALS, broken_kubeconfig(tmp_path, broken)).endswith(
        hint)


def test_serve_takes_the_service_account_before_kubeconfig(tmp_path: Path) -> None:
    service_account(tmp_path)
    listed = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBECONFIG": str(listed)}
    first = {accepts: load_credentials(kubeconfig=None, context=None, env=env,
                                       home=tmp_path, in_cluster_root=tmp_path,
                                       accepts=accepts).source
             for accepts in (SERVE_CREDENTIALS, DOCTOR_CREDENTIALS)}
    assert first[SERVE_CREDENTIALS] == "in-cluster service account"
    assert first[DOCTOR_CREDENTIALS] == f"kubeconfig {listed}, context test"


def test_the_help_says_the_order_the_search_takes() -> None:
    assert DOCTOR_CREDENTIALS.fallbacks() == (
        "$KUBECONFIG, ~/.kube/config, then the in-cluster service account")
    assert SERVE_CREDENTIALS.fallbacks() == (
        "the in-cluster service account, $KUBECONFIG, then ~/.kube/config")
