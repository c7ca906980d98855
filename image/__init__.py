"""The appliance image: a Debian root with Zerolayer installed and enabled, packed as a tar, an
ext4 file system and a GPT disk image (`zerolayer image build`, `make image`; see image/README.md)."""
