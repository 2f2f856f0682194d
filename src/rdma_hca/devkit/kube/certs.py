"""A test certificate authority and what it signed, for the fake API server over HTTPS.

The server's certificate names 127.0.0.1; the client's is for kubeconfigs that
authenticate by certificate. All are valid until 2126 and hold no secret of anyone's: they
exist so that a client talks TLS to the fake API server as it does to a real one in a pod
(the service account's ``ca.crt``), with the same handshake and the same TLS context.
"""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

CA_CRT = """\
-----BEGIN CERTIFICATE-----
MIIBejCCASGgAwIBAgIUZPBFpZ2J5WjCqZ6JF3Gblm6qTGgwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjExMjkxODI1MzFaGA8yMTI2MTEwNTE4
MjUzMVowEjEQMA4GA1UEAwwHdGVzdC1jYTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABJkDU2V82wpcKebuWEN8Ojf7wLe+HUDxIYs3K9p9pmdxyjLlEPzgFP0yO154
ziq888ych0HY3UnGTJ9QAxkLYEqjUzBRMB0GA1UdDgQWBBQ7rfNB/8RlkhHCCurf
64qqK7pd3TAfBgNVHSMEGDAWgBQ7rfNB/8RlkhHCCurf64qqK7pd3TAPBgNVHRMB
Af8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCIHfeLVuD62c3r7wSNU53+6+ZeaRr
O8jI+UGw0FHT7vWEAiBFJg3fwhl+4cYo+MsSyvMvIDHzk3ycywVGOIxPBPmdiA==
-----END CERTIFICATE-----
"""

SERVER_CRT = """\
-----BEGIN CERTIFICATE-----
MIIBkTCCATigAwIBAgIUN47DKse5IQTdURJ7zfN9YRFYaWAwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjExMjkxODI1MzFaGA8yMTI2MTEwNTE4
MjUzMVowFDESMBAGA1UEAwwJMTI3LjAuMC4xMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEdyn3N2xPcYIABx3//nusEYdb3wtOBHILeMB1DSQhK5klktPhnjLdKQ+T
b+qIstme/N4Eb3AMf42Fh0Ddt7B6SKNoMGYwDwYDVR0RBAgwBocEfwAAATATBgNV
HSUEDDAKBggrBgEFBQcDATAdBgNVHQ4EFgQU6/oxp0Qw/4E+LsEKMlf+Yz7PXCAw
HwYDVR0jBBgwFoAUO63zQf/EZZIRwgrq3+uKqiu6Xd0wCgYIKoZIzj0EAwIDRwAw
RAIgIlJ1KgMjGyRTM7XVXRBc8EvveT4WVmqQ12pz5RAGvvACIHVhphdbOjqBlgi7
/ncLVf7osPhaS/cK2J77ZhqmdUmQ
-----END CERTIFICATE-----
"""

SERVER_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg4p4bKpwHgkNwAgHY
IV5GxNBGyRul9qOvpcs1Y1JLa6GhRANCAAR3Kfc3bE9xggAHHf/+e6wRh1vfC04E
cgt4wHUNJCErmSWS0+GeMt0pD5Nv6oiy2Z783gRvcAx/jYWHQN23sHpI
-----END PRIVATE KEY-----
"""

CLIENT_CRT = """\
-----BEGIN CERTIFICATE-----
MIIBlDCCATugAwIBAgIUN47DKse5IQTdURJ7zfN9YRFYaWEwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjExMjkxODI1MzFaGA8yMTI2MTEwNTE4
MjUzMVowKDEPMA0GA1UEAwwGdmlld2VyMRUwEwYDVQQKDAxyZG1hLWRvY3RvcnMw
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAR8PVTUFQpr9jIrdRbl9ReptzjqIj5H
6igjb9bHGPgfr9O/mQLzkOoirUC4dwxGrTRZ/rjId8NS88rcOLrTeZoMo1cwVTAT
BgNVHSUEDDAKBggrBgEFBQcDAjAdBgNVHQ4EFgQUGh1FNeLIx2wNhD8mzQDZYCWS
DsMwHwYDVR0jBBgwFoAUO63zQf/EZZIRwgrq3+uKqiu6Xd0wCgYIKoZIzj0EAwID
RwAwRAIgON4vpxuTCbVnwGEXQZVJWIn8fgrYXAYwnumfiK9/rOECIGOeABHTBs8z
IOiAXa20reVl83l0BMpmf1ROZSjVHKA4
-----END CERTIFICATE-----
"""

CLIENT_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgTGKaT9YtTZbUOngi
TJO6FBPQpYodhXmu0OFInhtqHzuhRANCAAR8PVTUFQpr9jIrdRbl9ReptzjqIj5H
6igjb9bHGPgfr9O/mQLzkOoirUC4dwxGrTRZ/rjId8NS88rcOLrTeZoM
-----END PRIVATE KEY-----
"""



def server_tls(directory: Path, *, client_certs: bool = False) -> ssl.SSLContext:
    """The server side: its certificate and key (written to ``directory``, as
    ``load_cert_chain`` reads files); with ``client_certs``, a client certificate signed
    by the CA is demanded."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "server.crt").write_text(SERVER_CRT)
    (directory / "server.key").write_text(SERVER_KEY)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(directory / "server.crt", directory / "server.key")
    if client_certs:
        ctx.load_verify_locations(cadata=CA_CRT)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def ca_data() -> str:
    """The CA as a kubeconfig's ``certificate-authority-data`` holds it."""
    return base64.b64encode(CA_CRT.encode()).decode()
