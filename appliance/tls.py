"""Development certificates: a private CA and leaves it signs, EC P-256, for loopback and tests.

The server certificate is a separate CA:FALSE leaf because HTTP/3 clients (niquests/qh3) refuse a
self-signed CA:TRUE certificate as a server certificate; clients trust the CA file instead.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEV_HOSTS = ("localhost", "127.0.0.1", "::1")
_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class DevCert:
    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


def make_dev_cert(out_dir: Path, hosts: Sequence[str] = DEV_HOSTS) -> DevCert:
    """Write a fresh CA and a server leaf for `hosts` (DNS names or IP addresses) into `out_dir`.

    Always regenerates: clients that trusted an earlier CA must be given the new ca.crt."""
    if not hosts:
        raise ValueError("make_dev_cert needs at least one host name or address for the certificate")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = DevCert(out_dir / "ca.crt", out_dir / "ca.key", out_dir / "server.crt", out_dir / "server.key")
    ca, ca_key = make_ca(paths.ca_cert, paths.ca_key, "Zerolayer development CA")
    _issue(ca, ca_key, hosts[0], _san(hosts), ExtendedKeyUsageOID.SERVER_AUTH, paths.cert, paths.key)
    return paths


def make_ca(cert_path: Path, key_path: Path, common_name: str, validity: datetime.timedelta = _VALIDITY
            ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:  # fmt: skip
    """A self-signed CA that signs leaves only (path length 0), written as PEM (the key 0600)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(cert_path, ca)
    _write_key(key_path, ca_key)
    return ca, ca_key


def make_code_signer(ca_cert: Path, ca_key: Path, common_name: str, cert_path: Path, key_path: Path,
                     validity: datetime.timedelta = _VALIDITY) -> None:  # fmt: skip
    """A leaf of the CA at CA_CERT for signing updates (extended key usage codeSigning, which RAUC's
    check-purpose=codesign asks of the signer)."""
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key} is not an EC key; make the CA with make_ca")
    _issue(ca, key, common_name, None, ExtendedKeyUsageOID.CODE_SIGNING, cert_path, key_path, validity)


def make_client_cert(ca: DevCert, out_dir: Path, name: str) -> ClientCert:
    """Write a client (mTLS) leaf for `name`, signed by the CA of `ca`, into `out_dir`."""
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.ca_key} is not an EC key; make the CA with make_dev_cert")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = ClientCert(out_dir / f"{name}.crt", out_dir / f"{name}.key")
    san = x509.SubjectAlternativeName([x509.DNSName(name)])
    _issue(ca_cert, ca_key, name, san, ExtendedKeyUsageOID.CLIENT_AUTH, paths.cert, paths.key)
    return paths


def _issue(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str,
           san: x509.SubjectAlternativeName | None, usage: x509.ObjectIdentifier, cert_path: Path,
           key_path: Path, validity: datetime.timedelta = _VALIDITY) -> None:  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _builder(subject, ca.subject, key.public_key(), validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    cert = (builder.add_extension(san, critical=False) if san is not None else builder).sign(ca_key, hashes.SHA256())
    _write_cert(cert_path, cert)
    _write_key(key_path, key)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             validity: datetime.timedelta = _VALIDITY) -> x509.CertificateBuilder:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # tolerate a little clock skew
        .not_valid_after(now + validity)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    # Created 0600 so the key is never readable by others, not even between write and chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its old mode otherwise
        f.write(pem)
