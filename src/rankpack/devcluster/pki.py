"""The dev cluster's certificates, keys and static tokens, generated with `cryptography`.

Called once per `up` by `rankpack.devcluster.lifecycle.bringup` (a fresh CA every time:
`down` removes the state directory, so nothing outlives the cluster). Produces under
``<state>/pki``:

- ``ca.crt/.key``: the cluster CA (also the kubelet's client CA);
- ``apiserver.crt/.key``: serving cert for 127.0.0.1, the node IP, the first service IP
  and the `kubernetes.default.svc` names;
- ``apiserver-kubelet-client.crt/.key``: the apiserver's client cert to the kubelet;
- ``kubelet-<node>.crt/.key``: each node's kubelet serving cert for its node IP (the
  apiserver checks it);
- ``sa.key/.pub``: the service-account token signing key;
- ``tokens.csv``: static bearer tokens for admin, each kubelet (``system:node:<node>``),
  controller-manager and scheduler.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rankpack.devcluster.configs import Identity
from rankpack.devcluster.layout import NODE_IP, SERVICE_FIRST_IP, NodeSpec

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Credentials:
    ca_pem: str
    admin: Identity
    kubelets: dict[str, Identity]
    """Each node's kubelet (``system:node:<name>``), by node name."""
    controller_manager: Identity
    scheduler: Identity

    @property
    def identities(self) -> list[Identity]:
        return [self.admin, *self.kubelets.values(), self.controller_manager, self.scheduler]


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _issue(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate | None,
    ca_key: ec.EllipticCurvePrivateKey,
    server_names: tuple[list[str], list[str]] | None = None,
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
    )
    if ca_cert is None:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=0), critical=True
        ).add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        usages = []
        if server_names is not None:
            dns, ips = server_names
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    builder = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
    )
    return builder.sign(ca_key, hashes.SHA256())


def _pair(
    pki: Path,
    name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    subject: x509.Name,
    server_names: tuple[list[str], list[str]] | None = None,
    client: bool = False,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(
        subject=subject,
        key=key,
        ca_cert=ca[0],
        ca_key=ca[1],
        server_names=server_names,
        client=client,
    )
    (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pki / f"{name}.key", _key_pem(key))


def generate(pki: Path, nodes: Sequence[NodeSpec]) -> Credentials:
    """Create every key, certificate and token of a new cluster of `nodes` under `pki`."""
    pki.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue(subject=_name("rankpack-dev-ca"), key=ca_key, ca_cert=None, ca_key=ca_key)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    (pki / "ca.crt").write_bytes(ca_pem)
    _write_private(pki / "ca.key", _key_pem(ca_key))
    ca = (ca_cert, ca_key)

    api_dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    _pair(
        pki,
        "apiserver",
        ca,
        _name("kube-apiserver"),
        server_names=(api_dns, ["127.0.0.1", NODE_IP, SERVICE_FIRST_IP]),
    )
    _pair(
        pki,
        "apiserver-kubelet-client",
        ca,
        _name("kube-apiserver-kubelet-client", "system:masters"),
        client=True,
    )
    for node in nodes:
        _pair(
            pki,
            f"kubelet-{node.name}",
            ca,
            _name(f"system:node:{node.name}", "system:nodes"),
            server_names=([node.name, "localhost"], [node.ip, "127.0.0.1"]),
        )

    # Service-account tokens are signed with RSA (what every client expects of RS256).
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(pki / "sa.key", _key_pem(sa_key))
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )

    def token() -> str:
        return secrets.token_hex(24)

    return Credentials(
        ca_pem=ca_pem.decode(),
        admin=Identity("rankpack-admin", ("system:masters",), token()),
        kubelets={
            n.name: Identity(f"system:node:{n.name}", ("system:nodes",), token()) for n in nodes
        },
        controller_manager=Identity("system:kube-controller-manager", (), token()),
        scheduler=Identity("system:kube-scheduler", (), token()),
    )
