"""Config: drop-ins in name order, every mistake naming file:key, `config check`, and the README
reference generated from the schema."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from appliance.config import EX_CONFIG, ConfigError, load_config, reference_table


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "fw").mkdir()
    (tmp_path / "keys").mkdir()
    (tmp_path / "zerolayer.toml").write_text(f"""
[firmware]
path = "{tmp_path / 'fw'}"
trusted_keys = "{tmp_path / 'keys'}"
[listen]
quic = ""
tcp = ""
[limits]
max_queued = 10
""")
    return tmp_path


def test_drop_ins_override_in_name_order_and_sources_are_kept(root: Path) -> None:
    (root / "conf.d" / "20-b.toml").write_text("[limits]\nmax_queued = 30\n")
    (root / "conf.d" / "10-a.toml").write_text("[limits]\nmax_queued = 20\nmax_body_bytes = 4096\n")
    config = load_config(root)
    assert config.limits.max_queued == 30 and config.limits.max_body_bytes == 4096
    assert config.sources["limits.max_queued"] == str(root / "conf.d" / "20-b.toml")
    assert config.sources["limits.max_body_bytes"] == str(root / "conf.d" / "10-a.toml")
    assert config.limits.max_active_per_device == 8  # a default


def test_bundle_tables_add_up_across_drop_ins_and_an_empty_path_removes_one(root: Path) -> None:
    for name in ("a", "b", "c"):
        (root / name).mkdir()
    (root / "conf.d" / "10-a.toml").write_text(f"[firmware.bundles]\na = '{root / 'a'}'\nb = '{root / 'b'}'\n")
    (root / "conf.d" / "20-c.toml").write_text(f"[firmware.bundles]\nc = '{root / 'c'}'\nb = ''\n")
    config = load_config(root)
    assert config.firmware.bundles == (("a", root / "a"), ("c", root / "c"))
    assert config.firmware.path == root / "fw"  # served first, beside the table's
    from appliance.config import toml_value

    assert tomllib.loads(f"t = {toml_value(config.firmware.bundles)}")["t"] == {"a": str(root / "a"),
                                                                               "c": str(root / "c")}  # fmt: skip


@pytest.mark.parametrize(
    ("drop_in", "message"),
    [
        ("[limits]\nmax_queue = 5\n", "99-x.toml: unknown key limits.max_queue (did you mean 'max_queued'?)"),
        ("[limts]\nmax_queued = 5\n", "99-x.toml: unknown section [limts] (did you mean 'limits'?)"),
        ("[limits]\nmax_queued = 'many'\n", "99-x.toml: limits.max_queued: expected an integer"),
        ("[limits]\nmax_queued = 0\n", "99-x.toml: limits.max_queued: 0 is out of range [1, 100000]"),
        ("[auth]\nrequired = 'yes'\n", "99-x.toml: auth.required: expected true or false"),
        ("[listen]\ntcp = 'localhost'\n", "99-x.toml: listen.tcp: 'localhost' is not HOST:PORT"),
        ("[listen]\nunix_mode = '999'\n", "99-x.toml: listen.unix_mode"),
        ("[log]\nlevel = 'loud'\n", "99-x.toml: log.level: 'loud' is not one of"),
        ("[limits]\nquic_retry = 'sometimes'\n", "99-x.toml: limits.quic_retry: 'sometimes' is not one of auto"),
        ("[firmware]\npath = '/nonexistent/fw'\n", "99-x.toml: firmware.path: /nonexistent/fw does not exist"),
        ("[firmware.bundles]\nb = '/nonexistent/b'\n", "99-x.toml: firmware.bundles.b: /nonexistent/b does not exist"),
        ("[firmware]\nbundles = ['a']\n", "99-x.toml: firmware.bundles: expected a table of model name = bundle path"),
        ("[firmware.bundles]\n'a b' = '/tmp'\n", "99-x.toml: firmware.bundles: 'a b' is not a model name"),
        ("[firmware]\npath = ''\n", "firmware.path: no firmware to serve: set firmware.path or [firmware.bundles]"),
        ("limits = 3\n", "99-x.toml: limits must be a table"),
        ("[limits\n", "99-x.toml: "),
    ],
)
def test_mistakes_name_file_and_key(root: Path, drop_in: str, message: str) -> None:
    (root / "conf.d" / "99-x.toml").write_text(drop_in)
    with pytest.raises(ConfigError) as info:
        load_config(root)
    assert any(message in p for p in info.value.problems), info.value.problems


def test_config_check_prints_sources_or_exits_78(root: Path) -> None:
    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance.cli", "config", "check", "--config", str(root)],
                              capture_output=True, text=True)  # fmt: skip

    ok = check()
    assert ok.returncode == 0, ok.stderr
    assert any(line.startswith("max_queued = 10") and line.endswith(f"# {root / 'zerolayer.toml'}")
               for line in ok.stdout.splitlines())  # fmt: skip
    assert any(line.startswith("max_body_bytes = 1048576") and line.endswith("# default")
               for line in ok.stdout.splitlines())  # fmt: skip
    merged = "\n".join(line.split("#", 1)[0].rstrip() for line in ok.stdout.splitlines())
    assert tomllib.loads(merged)["kernel"] == {  # TOML a user can paste back, tuples as arrays
        "mode": "auto", "interfaces": ["auto"], "allowlist": [], "xdp": "off", "flow_idle_seconds": 600.0,
        "pin_dir": ""}
    (root / "conf.d" / "50-bad.toml").write_text("[engine]\nthreds = 2\n")
    bad = check()
    assert bad.returncode == EX_CONFIG
    assert "50-bad.toml: unknown key engine.threds (did you mean 'threads'?)" in bad.stderr
    serve = subprocess.run([sys.executable, "-m", "appliance.cli", "serve", "--config", str(root)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert serve.returncode == EX_CONFIG and "engine.threds" in serve.stderr
    (root / "conf.d" / "50-bad.toml").write_bytes(b"\x00\xff\xfe[limits]\n")  # not UTF-8
    binary = check()
    assert binary.returncode == EX_CONFIG and "Traceback" not in binary.stderr
    assert "50-bad.toml: not UTF-8 text" in binary.stderr


def test_config_cannot_raise_the_baked_shard_size(tiny_bundle_path: Path, trusted_keys: Path, tmp_path: Path) -> None:
    from appliance.devsetup import write_dev_config

    extra = "[engine]\nmax_tokens_per_shard = 65\n"
    setup = write_dev_config(tmp_path / "etc", tiny_bundle_path, trusted_keys, extra=extra)
    result = subprocess.run([sys.executable, "-m", "appliance.cli", "serve", "--config", str(setup.root)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == EX_CONFIG
    assert "engine.max_tokens_per_shard = 65 exceeds the firmware's baked 64" in result.stderr


def test_readme_reference_is_the_schema() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert reference_table() in readme, "README config table drifted: paste `python -c 'from appliance.config " \
        "import reference_table; print(reference_table())'`"
