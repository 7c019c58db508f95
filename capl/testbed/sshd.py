"""The sshd configuration of the test beds' ssh endpoints: key-only root login, nothing else.

One policy for every private sshd the beds start (tests/fixtures/transports.py on loopback,
kvm3 of the multi-host bed in its namespaces): root by public key only, no passwords, no PAM,
no forwarding, no TTY; verbose logs for failure messages.
"""

from __future__ import annotations

from pathlib import Path


def sshd_config(*, listen: str, host_key: Path, authorized_keys: Path, pid_file: Path) -> bytes:
    """sshd_config text for an sshd listening on `listen` (``address:port``)."""
    lines = [
        f"ListenAddress {listen}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {pid_file}",
        "PermitRootLogin prohibit-password",
        "AllowUsers root",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTTY no",
        "PrintMotd no",
        "LogLevel VERBOSE",
    ]
    return ("\n".join(lines) + "\n").encode()
