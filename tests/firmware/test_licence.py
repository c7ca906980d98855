"""A bundle keeps the terms its model is used under: in the signed manifest (name, address,
notice) and as files whose text is hashed and signed like the model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import firmware
from firmware import BundleError
from firmware.manifest import Licence, parse_manifest
from firmware.toolchain.build import BuildOptions, build, sign

TERMS = Licence(name="Example Terms", url="https://example.org/terms", notice="Provided under the Example Terms.")


@pytest.fixture
def licensed(tiny_bundle_path: Path, tmp_path: Path, dev_key: Path) -> Path:
    terms = tmp_path / "TERMS.html"
    terms.write_text("<p>the terms</p>")
    out = tmp_path / "licensed"
    build(tiny_bundle_path, out, BuildOptions(name="tiny-licensed", licence=TERMS, licence_files=(terms,)),
          key=dev_key)  # fmt: skip
    return out


def test_the_licence_is_in_the_signed_manifest_and_its_text_in_the_bundle(licensed: Path, trusted_keys: Path) -> None:
    bundle = firmware.load(licensed, trusted_keys)
    licence = bundle.manifest.licence
    assert licence is not None and licence.name == "Example Terms" and licence.url == TERMS.url
    assert licence.notice == TERMS.notice and licence.files == ("licence/TERMS.html",)
    assert (licensed / "licence" / "TERMS.html").read_text() == "<p>the terms</p>"
    assert "licence/TERMS.html" in bundle.manifest.files
    raw = (licensed / "manifest.json").read_bytes()
    assert parse_manifest(raw).to_json_bytes() == raw


def test_a_manifest_without_a_licence_has_no_licence_field(tiny_bundle_path: Path) -> None:
    """Older manifests' bytes, and so their signatures, are unchanged."""
    assert "licence" not in json.loads((tiny_bundle_path / "manifest.json").read_text())


def test_changed_terms_are_refused(licensed: Path, trusted_keys: Path) -> None:
    (licensed / "licence" / "TERMS.html").write_text("<p>other terms</p>")
    with pytest.raises(BundleError, match=r"licence/TERMS\.html"):
        firmware.verify(licensed, trusted_keys)


def test_an_edited_notice_breaks_the_signature(licensed: Path, trusted_keys: Path) -> None:
    manifest = licensed / "manifest.json"
    manifest.write_text(manifest.read_text().replace("Provided under", "Free of"))
    with pytest.raises(BundleError, match="signature"):
        firmware.verify(licensed, trusted_keys)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda lic: lic.update(files=["licence/ELSEWHERE.html"]), "licence file 'licence/ELSEWHERE.html'"),
        (lambda lic: lic.update(expires="never"), "licence.'expires'"),
        (lambda lic: lic.pop("notice"), "licence.'notice'"),
    ],
    ids=["file-not-in-bundle", "unknown-field", "missing-notice"],
)  # fmt: skip
def test_a_signed_but_invalid_licence_is_refused(licensed: Path, trusted_keys: Path, dev_key: Path,
                                                  edit, message: str) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    doc = json.loads((licensed / "manifest.json").read_text())
    edit(doc["licence"])
    (licensed / "manifest.json").write_text(json.dumps(doc))
    sign(licensed, dev_key)
    with pytest.raises(BundleError, match=message):
        firmware.verify(licensed, trusted_keys)


def test_the_build_command_takes_a_template_end_tokens_and_terms(
        tiny_bundle_path: Path, tmp_path: Path, dev_key: Path, trusted_keys: Path) -> None:  # fmt: skip
    import subprocess
    import sys

    (tmp_path / "template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    (tmp_path / "TERMS.txt").write_text("the terms")

    def zerolayer(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "appliance.cli", "firmware", *map(str, args)],
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip

    out = tmp_path / "bundle"
    done = zerolayer("build", "--from", tiny_bundle_path, "--out", out, "--name", "tiny-cli", "--key", dev_key,
                     "--chat-template", tmp_path / "template.jinja", "--eos-token", "<|im_end|>",
                     "--licence-name", "Example Terms", "--licence-url", "https://example.org/terms",
                     "--licence-file", tmp_path / "TERMS.txt")  # fmt: skip
    assert done.returncode == 0, done.stderr
    bundle = firmware.load(out, trusted_keys)
    assert bundle.chat_template == (tmp_path / "template.jinja").read_text()
    assert bundle.manifest.licence == Licence("Example Terms", "https://example.org/terms", "", ("licence/TERMS.txt",))
    shown = zerolayer("inspect", out, "--trusted-keys", trusted_keys).stdout
    assert "licence:     Example Terms (https://example.org/terms)" in shown and "licence/TERMS.txt" in shown
    refused = zerolayer("build", "--from", tiny_bundle_path, "--out", tmp_path / "x", "--licence-file",
                        tmp_path / "TERMS.txt")  # fmt: skip
    assert refused.returncode == 2 and "need --licence-name" in refused.stderr
