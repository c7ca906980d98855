"""A complete development appliance in one folder: config, dev TLS certificate, an API key.

`make run` serves the demo firmware with it, and the tests and benchmarks start daemons with it;
nothing here is used on a real appliance, where /etc/zerolayer is written by the image build and
the operator.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from appliance.api.auth import add_key
from appliance.tls import DEV_HOSTS, make_dev_cert


@dataclass(frozen=True)
class DevSetup:
    root: Path  # the config root (zerolayer.toml inside)
    api_key: str
    ca_cert: Path
    unix_socket: Path


def write_dev_config(root: Path, firmware_path: Path | None, trusted_keys: Path, *, tcp: str = "127.0.0.1:0",
                     quic: str = "127.0.0.1:0", extra: str = "", kernel: str = "off",
                     cert_hosts: Sequence[str] = DEV_HOSTS, bundles: Mapping[str, Path] | None = None,
                     ) -> DevSetup:  # fmt: skip
    """Write (or reuse) a config root; the API key is kept beside it (0600) so it can be shown again.
    The certificate, made on first use, names `cert_hosts` (the addresses clients will dial).
    `bundles`: more models served beside firmware_path's ([firmware.bundles])."""
    root.mkdir(parents=True, exist_ok=True)
    tls_dir = root / "tls"
    if not (tls_dir / "server.crt").is_file():
        make_dev_cert(tls_dir, cert_hosts)
    key_file = root / "api-keys"
    plain = root / "dev-api-key"
    if not plain.is_file():
        key_file.unlink(missing_ok=True)
        key = add_key(key_file, "dev", debug=True)
        fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
    sock = root / "api.sock"
    table = "".join(f'"{name}" = "{path}"\n' for name, path in (bundles or {}).items())
    (root / "zerolayer.toml").write_text(f"""\
# Development appliance (written by appliance.devsetup); a real one lives in /etc/zerolayer.
[firmware]
path = "{firmware_path or ''}"
trusted_keys = "{trusted_keys}"
{"[firmware.bundles]" if table else ""}
{table}
[listen]
quic = "{quic}"
tcp = "{tcp}"
unix = "{sock}"

[tls]
cert = "{tls_dir / 'server.crt'}"
key = "{tls_dir / 'server.key'}"

[auth]
keys_file = "{key_file}"

[state]
dir = "{root / 'state'}"

[kernel]
mode = "{kernel}"
{extra}""")
    return DevSetup(root, plain.read_text().strip(), tls_dir / "ca.crt", sock)
