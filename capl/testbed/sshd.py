"""The sshd configuration of the test beds' ssh endpoints: key-only root login, local forwards.

One policy for every private sshd the beds start (tests/fixtures/transports.py on loopback,
kvm3 of the multi-host bed in its namespaces): root by public key only, no passwords, no PAM,
no TTY, no agent or X11 forwarding; verbose logs for failure messages.

Forwarding: `capl vnc` on a ``qemu+ssh://`` host runs ``ssh -N -L 127.0.0.1:PORT:<socket>``
to the domain's VNC display, a unix socket in libvirt's per-domain directory
(``/var/lib/libvirt/qemu/domain-<id>-<name>/vnc.sock``, a new path each time the domain
starts). So the client may open *local* forwards (``AllowTcpForwarding local``,
``AllowStreamLocalForwarding local``); the server listens for none on the client's behalf
(no remote forwards, ``PermitListen none``, ``GatewayPorts no``). Measured with OpenSSH 9.2:
``AllowTcpForwarding no`` also refuses forwards to unix sockets ("Received request to
connect to path ..., but the request was denied"), and ``PermitOpen`` applies to unix-socket
targets too, matching exact paths only (``PermitOpen [/path/vnc.sock]:*``), no directory or
glob. A ``PermitOpen`` of loopback ports would therefore refuse the VNC tunnel, and no list
could name the per-start socket paths: forwards are not restricted by destination. These
sshds serve test beds only (loopback, the bed's namespaces).

``forwarding=False``: no forwards of any kind, for tests of how `capl vnc` reports a host
that refuses them.
"""

from __future__ import annotations

from pathlib import Path


def sshd_config(
    *,
    listen: str,
    host_key: Path,
    authorized_keys: Path,
    pid_file: Path,
    forwarding: bool = True,
) -> bytes:
    """sshd_config text for an sshd listening on `listen` (``address:port``)."""
    forwards = "local" if forwarding else "no"
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
        f"AllowTcpForwarding {forwards}",
        f"AllowStreamLocalForwarding {forwards}",
        "PermitListen none",
        "GatewayPorts no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTTY no",
        "PrintMotd no",
        "LogLevel VERBOSE",
    ]
    return ("\n".join(lines) + "\n").encode()
