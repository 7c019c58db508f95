"""Unit tests of the libvirt XML builders and parsers and the pool drivers (capl.virt)."""
