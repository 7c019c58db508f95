"""Where a machine's domain is, and how to reach its host: what `capl console` and `capl
images` look up through the API before they connect to libvirt.

1. The machine (``resolve_target``): a LibvirtMachine of that name, else a Cluster API
   Machine of that name whose ``spec.infrastructureRef`` is a LibvirtMachine (so both names
   users see work). ``spec.hostName`` and ``spec.domainUUID`` say where the domain is.
2. The host (``host_access``): the LibvirtCluster of the machine's cluster (through the
   Cluster's ``infrastructureRef`` when Cluster API is installed, else by name or cluster
   label) has ``spec.hosts[]`` with the URI, the credentials Secret and the
   insecure-transport opt-ins. ``HostAccess.connect`` makes the connection with
   ``capl.virt.LibvirtHosts`` exactly as the manager makes it (credential files, ssh
   wrapper, known_hosts pinning); the credentials stay in memory only.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capl.commands.shared import api_failure, list_kind
from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, CliError

if TYPE_CHECKING:
    from capl.kube.client import KubeClient
    from capl.virt import LibvirtHost, LibvirtHosts

__all__ = [
    "ConsoleTarget",
    "HostAccess",
    "find_libvirt_machine",
    "get_or_none",
    "host_access",
    "libvirt_cluster_of",
    "resolve_target",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostAccess:
    """How to reach one host of a LibvirtCluster (credentials stay in memory only)."""

    name: str
    uri: str
    credentials: Mapping[str, bytes] | None
    allow_insecure_tcp: bool = False
    insecure_skip_host_key_verification: bool = False

    def __repr__(self) -> str:  # never show credentials
        return f"HostAccess({self.name}, {self.uri.split('?', 1)[0]})"

    def connect(self, hosts: LibvirtHosts) -> LibvirtHost:
        """The shared host of ``hosts`` for this access (no I/O yet)."""
        from capl.ports.virt import HostOptions

        return hosts.get(
            uri=self.uri,
            credentials=self.credentials,
            options=HostOptions(
                allow_insecure_tcp=self.allow_insecure_tcp,
                insecure_skip_host_key_verification=self.insecure_skip_host_key_verification,
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleTarget:
    """Where a machine's domain is and how to reach its host."""

    namespace: str
    machine: str
    """The LibvirtMachine's name."""
    uuid: str
    host: HostAccess


async def host_access(client: KubeClient, cluster: Mapping[str, Any], host_name: str) -> HostAccess:
    """``spec.hosts[name=host_name]`` of a LibvirtCluster, with its credentials Secret read."""
    from capl.runtime.errors import ApiError, NotFound
    from capl.runtime.objects import ObjectKey
    from capl.runtime.resources import SECRET

    namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
    host = next(
        (
            h
            for h in (cluster.get("spec") or {}).get("hosts") or ()
            if isinstance(h, Mapping) and h.get("name") == host_name
        ),
        None,
    )
    if host is None:
        raise CliError(
            f"LibvirtCluster {namespace}/{name} has no host {host_name!r}", code=EXIT_NOT_FOUND
        )
    credentials = None
    secret_name = (host.get("credentialsRef") or {}).get("name")
    if secret_name:
        try:
            secret = await client.resource(SECRET).get(ObjectKey(namespace, str(secret_name)))
        except NotFound:
            raise CliError(
                f"the credentials Secret {namespace}/{secret_name} of host {host_name} "
                "does not exist",
                code=EXIT_FAILED,
            ) from None
        except ApiError as exc:
            raise api_failure(
                exc,
                server=str(client.configuration.host),
                what=f"read the credentials Secret {namespace}/{secret_name}",
            ) from exc
        try:
            credentials = {
                key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()
            }
        except (ValueError, TypeError):
            raise CliError(
                f"the credentials Secret {namespace}/{secret_name} holds data that is not base64",
                code=EXIT_FAILED,
            ) from None
    return HostAccess(
        name=host_name,
        uri=str(host.get("uri") or ""),
        credentials=credentials,
        allow_insecure_tcp=bool(host.get("allowInsecureTCP")),
        insecure_skip_host_key_verification=bool(host.get("insecureSkipHostKeyVerification")),
    )


async def find_libvirt_machine(
    client: KubeClient, *, namespace: str, name: str
) -> dict[str, Any] | None:
    """The LibvirtMachine of that name, else the one a Machine of that name refers to."""
    from capl.runtime.resources import LIBVIRT_MACHINE

    found = await get_or_none(client, LIBVIRT_MACHINE, namespace, name)
    return found if found is not None else await _via_machine(client, namespace, name)


async def resolve_target(client: KubeClient, *, namespace: str, name: str) -> ConsoleTarget:
    """The domain of machine ``namespace/name`` and its host; CliError when anything is missing."""
    lm = await find_libvirt_machine(client, namespace=namespace, name=name)
    if lm is None:
        raise CliError(
            f"machine {namespace}/{name} not found (no LibvirtMachine or Machine of that name)",
            code=EXIT_NOT_FOUND,
        )
    lm_name = str(lm["metadata"]["name"])
    spec = lm.get("spec") or {}
    uuid, host_name = spec.get("domainUUID"), spec.get("hostName")
    if not uuid or not host_name:
        raise CliError(
            f"LibvirtMachine {namespace}/{lm_name} has no domain yet "
            "(spec.domainUUID and spec.hostName are set once the domain is defined)",
            code=EXIT_FAILED,
        )
    cluster = await libvirt_cluster_of(client, lm, str(host_name))
    try:
        access = await host_access(client, cluster, str(host_name))
    except CliError as exc:
        if exc.code == EXIT_NOT_FOUND:
            raise CliError(f"{exc} (LibvirtMachine {lm_name} runs there)", code=exc.code) from None
        raise
    return ConsoleTarget(namespace=namespace, machine=lm_name, uuid=str(uuid), host=access)


async def get_or_none(
    client: KubeClient, resource: Any, namespace: str, name: str
) -> dict[str, Any] | None:
    """The object, or None when it (or its kind) does not exist."""
    from capl.runtime.errors import ApiError, NotFound
    from capl.runtime.objects import ObjectKey

    try:
        return await client.resource(resource).get(ObjectKey(namespace, name))
    except NotFound:
        return None
    except ApiError as exc:
        raise api_failure(
            exc,
            server=str(client.configuration.host),
            what=f"read {resource.kind} {namespace}/{name}",
        ) from exc


async def _via_machine(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    from capl.runtime.resources import LIBVIRT_MACHINE, MACHINE

    machine = await get_or_none(client, MACHINE, namespace, name)
    ref = (machine or {}).get("spec", {}).get("infrastructureRef") or {}
    if ref.get("kind") != "LibvirtMachine" or not ref.get("name"):
        return None
    return await get_or_none(client, LIBVIRT_MACHINE, namespace, str(ref["name"]))


async def libvirt_cluster_of(
    client: KubeClient, lm: Mapping[str, Any], host_name: str
) -> dict[str, Any]:
    """The LibvirtCluster of a LibvirtMachine's cluster (Cluster's infrastructureRef, else by
    name or cluster label; without a cluster label, the only one with a host ``host_name``);
    CliError (exit 3) when there is none."""
    from capl.api.constants import CLUSTER_NAME_LABEL
    from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER

    namespace = str(lm["metadata"]["namespace"])
    cluster_name = (lm["metadata"].get("labels") or {}).get(CLUSTER_NAME_LABEL)
    if cluster_name:
        capi = await get_or_none(client, CLUSTER, namespace, cluster_name)
        ref = (capi or {}).get("spec", {}).get("infrastructureRef") or {}
        if ref.get("kind") == "LibvirtCluster" and ref.get("name"):
            found = await get_or_none(client, LIBVIRT_CLUSTER, namespace, str(ref["name"]))
            if found is not None:
                return found
        found = await get_or_none(client, LIBVIRT_CLUSTER, namespace, cluster_name)
        if found is not None:
            return found
    candidates = await list_kind(client, LIBVIRT_CLUSTER, namespace=namespace) or []
    if cluster_name:
        labelled = [
            c
            for c in candidates
            if (c["metadata"].get("labels") or {}).get(CLUSTER_NAME_LABEL) == cluster_name
        ]
        if len(labelled) == 1:
            return labelled[0]
    with_host = [
        c
        for c in candidates
        if any(
            isinstance(h, Mapping) and h.get("name") == host_name
            for h in (c.get("spec") or {}).get("hosts") or ()
        )
    ]
    if len(with_host) == 1 and not cluster_name:
        return with_host[0]
    lm_name = lm["metadata"]["name"]
    which = f"of cluster {cluster_name!r}" if cluster_name else f"with a host {host_name!r}"
    raise CliError(
        f"no LibvirtCluster {which} found in namespace {namespace} for LibvirtMachine {lm_name}",
        code=EXIT_NOT_FOUND,
    )
