"""Names shared by the API, the controllers, the webhooks and the generated manifests.

Everything that is spelled the same way in Go-land Cluster API and in capl lives here once:
the API group and versions, the contract label, the finalizers, the well-known labels and
annotations of Cluster API, and the condition types and reasons capl reports. String enums
(`StrEnum`) are used for closed sets so that mypy catches typos while the values still compare
equal to, and serialise as, plain strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# --- API group and versions -----------------------------------------------------------------

GROUP: Final = "infrastructure.cluster.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "infrastructure.cluster.x-k8s.io/v1alpha1"  # GROUP/VERSION

CAPI_GROUP: Final = "cluster.x-k8s.io"
CAPI_VERSION: Final = "v1beta2"
CAPI_API_VERSION: Final = "cluster.x-k8s.io/v1beta2"  # CAPI_GROUP/CAPI_VERSION

#: The Cluster API contract capl implements; also the key of the CRD contract label.
CONTRACT_VERSION: Final = "v1beta2"
#: Label on every CRD: maps the contract to the CRD versions that implement it ("_"-joined).
CONTRACT_LABEL: Final = f"{CAPI_GROUP}/{CONTRACT_VERSION}"
CONTRACT_LABEL_VALUE: Final = VERSION

PROVIDER_LABEL: Final = "cluster.x-k8s.io/provider"
PROVIDER_NAME: Final = "infrastructure-libvirt"


class Kind(StrEnum):
    """The kinds capl serves."""

    LIBVIRT_CLUSTER = "LibvirtCluster"
    LIBVIRT_MACHINE = "LibvirtMachine"
    LIBVIRT_CLUSTER_TEMPLATE = "LibvirtClusterTemplate"
    LIBVIRT_MACHINE_TEMPLATE = "LibvirtMachineTemplate"
    LIBVIRT_MACHINE_MIGRATION = "LibvirtMachineMigration"


class Plural(StrEnum):
    """Resource (plural) names of the kinds, as used in URLs and RBAC rules."""

    LIBVIRT_CLUSTERS = "libvirtclusters"
    LIBVIRT_MACHINES = "libvirtmachines"
    LIBVIRT_CLUSTER_TEMPLATES = "libvirtclustertemplates"
    LIBVIRT_MACHINE_TEMPLATES = "libvirtmachinetemplates"
    LIBVIRT_MACHINE_MIGRATIONS = "libvirtmachinemigrations"


# --- Finalizers ------------------------------------------------------------------------------

MACHINE_FINALIZER: Final = "libvirtmachine.infrastructure.cluster.x-k8s.io"
CLUSTER_FINALIZER: Final = "libvirtcluster.infrastructure.cluster.x-k8s.io"
#: On a LibvirtMachineMigration until it is finished: deleting an unfinished one aborts it.
MIGRATION_FINALIZER: Final = "libvirtmachinemigration.infrastructure.cluster.x-k8s.io"
#: On the LibvirtMachineMigrations a host's maintenance creates: the host being evacuated.
EVACUATION_HOST_LABEL: Final = "infrastructure.cluster.x-k8s.io/evacuation-host"

# --- Cluster API labels and annotations ------------------------------------------------------

CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL: Final = "cluster.x-k8s.io/control-plane"
#: `--watch-filter=<value>` makes the manager reconcile only objects carrying this label.
WATCH_FILTER_LABEL: Final = "cluster.x-k8s.io/watch-filter"
PAUSED_ANNOTATION: Final = "cluster.x-k8s.io/paused"
#: InfraClusters carrying this annotation are managed by something else: hands off.
MANAGED_BY_ANNOTATION: Final = "cluster.x-k8s.io/managed-by"
#: Set by the topology controller on objects it sends as server-side-apply dry runs.
TOPOLOGY_DRY_RUN_ANNOTATION: Final = "topology.cluster.x-k8s.io/dry-run"
#: clusterctl move takes every object carrying this label (any value), owner references or
#: not: capl sets it on the credentials Secrets its LibvirtClusters use.
CLUSTERCTL_MOVE_LABEL: Final = "clusterctl.cluster.x-k8s.io/move"

# --- Well-known Node labels (set on workload Nodes, as a cloud provider would) ---------------

ZONE_LABEL: Final = "topology.kubernetes.io/zone"
REGION_LABEL: Final = "topology.kubernetes.io/region"

# --- Identity of what capl creates -----------------------------------------------------------

#: `spec.providerID` is this prefix followed by the libvirt domain UUID (which the guest
#: also sees as its SMBIOS system UUID).
PROVIDER_ID_PREFIX: Final = "libvirt:///"
#: XML namespace of capl's ownership metadata inside libvirt objects.
LIBVIRT_METADATA_NS: Final = "https://capl.dev/xmlns/v1alpha1"
LIBVIRT_METADATA_PREFIX: Final = "capl"

#: Keys of the credentials Secret a host may reference (`spec.hosts[].credentialsRef`).
CREDENTIALS_SSH_PRIVATE_KEY: Final = "ssh-privatekey"
CREDENTIALS_SSH_KNOWN_HOSTS: Final = "known_hosts"
CREDENTIALS_TLS_CERT: Final = "tls.crt"
CREDENTIALS_TLS_KEY: Final = "tls.key"
CREDENTIALS_CA_CERT: Final = "ca.crt"

#: Keys of a Cluster API bootstrap data Secret.
BOOTSTRAP_DATA_KEY: Final = "value"
BOOTSTRAP_FORMAT_KEY: Final = "format"


class BootstrapFormat(StrEnum):
    CLOUD_CONFIG = "cloud-config"
    IGNITION = "ignition"


# --- Conditions ------------------------------------------------------------------------------


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types capl sets (metav1.Condition `type`)."""

    # Both kinds.
    READY = "Ready"
    PAUSED = "Paused"
    # LibvirtCluster.
    HOSTS_REACHABLE = "HostsReachable"
    NETWORK_READY = "NetworkReady"
    STORAGE_READY = "StorageReady"
    CONTROL_PLANE_ENDPOINT_READY = "ControlPlaneEndpointReady"
    CREDENTIALS_OWNED = "CredentialsOwned"
    """The credentials Secrets carry the LibvirtCluster's owner reference (not part of
    Ready: the clusterctl move label takes a Secret whose owner reference was refused)."""
    # LibvirtMachine.
    DOMAIN_PROVISIONED = "DomainProvisioned"
    BOOTSTRAP_DATA_DELIVERED = "BootstrapDataDelivered"
    ADDRESS_ASSIGNED = "AddressAssigned"
    BOOTSTRAP_SUCCEEDED = "BootstrapSucceeded"
    """Read through the guest agent; absent on guests without one (not part of Ready)."""
    MIGRATING = "Migrating"
    """True while a live migration moves the domain (spec.migrationTarget is set)."""
    IP_ADDRESSES_CLAIMED = "IPAddressesClaimed"
    """Only on machines with networkInterfaces[].addressesFromPools: every IPAddressClaim is
    bound (Cluster API IPAM). No domain is made while it is False."""
    HARDWARE_UPDATED = "HardwareUpdated"
    """Day-2 changes (cpus, memory, disk sizes, extra disks, NICs) applied to the running
    domain; False while some wait for the next power cycle or failed (not part of Ready).
    Absent until the spec first changes after creation."""
    # LibvirtMachineMigration.
    SUCCEEDED = "Succeeded"


class Reason(StrEnum):
    """Condition reasons (CamelCase, as metav1.Condition requires).

    Positive/negative pairs first, then the reasons that say what is being waited on, then
    the failures a user can act on. Controllers may add more; keep them here so that the
    set stays documented in one place.
    """

    READY = "Ready"
    NOT_READY = "NotReady"
    PAUSED = "Paused"
    NOT_PAUSED = "NotPaused"
    PROVISIONED = "Provisioned"
    PROVISIONING = "Provisioning"
    DELETING = "Deleting"
    REACHABLE = "Reachable"
    UNREACHABLE = "Unreachable"
    RUNNING = "Running"
    ASSIGNED = "Assigned"
    DELIVERED = "Delivered"
    BOOTSTRAP_SUCCEEDED = "BootstrapSucceeded"
    # Waiting.
    WAITING_FOR_CLUSTER = "WaitingForCluster"
    WAITING_FOR_CLUSTER_INFRASTRUCTURE = "WaitingForClusterInfrastructure"
    WAITING_FOR_BOOTSTRAP_DATA = "WaitingForBootstrapData"
    WAITING_FOR_ADDRESS = "WaitingForAddress"
    WAITING_FOR_CONTROL_PLANE = "WaitingForControlPlane"
    WAITING_FOR_DOMAIN = "WaitingForDomain"
    WAITING_FOR_BOOTSTRAP = "WaitingForBootstrap"
    """The guest agent answers; the bootstrap success file is not there yet."""
    WAITING_FOR_IP_ADDRESS = "WaitingForIPAddress"
    """An IPAddressClaim is not bound to an IPAddress yet."""
    CLAIMED = "Claimed"
    POOL_EXHAUSTED = "PoolExhausted"
    """The IPAM pool of an unbound IPAddressClaim reports no free address."""
    ADDRESS_OUTSIDE_NETWORK = "AddressOutsideNetwork"
    """An IPAM address for a NIC on capl's DHCP network lies outside the network's CIDR."""
    INVALID_IP_ADDRESS = "InvalidIPAddress"
    """A bound IPAddress that capl cannot use (not IPv4, no prefix, a claim of another owner)."""
    # Failures with a cause the user can fix.
    HOST_NOT_FOUND = "HostNotFound"
    HARDWARE_UNAVAILABLE = "HardwareUnavailable"
    """No host (or not the pinned one) can give the machine its CPU, memory or devices."""
    FAILURE_DOMAIN_CONFLICT = "FailureDomainConflict"
    """spec.hostName names another host than the Machine's spec.failureDomain."""
    OWNER_REFERENCE_SET = "OwnerReferenceSet"
    OWNER_REFERENCE_REFUSED = "OwnerReferenceRefused"
    """The API server refused the credentials Secret's owner reference (e.g. the
    OwnerReferencesPermissionEnforcement admission plugin)."""
    CREDENTIALS_INVALID = "CredentialsInvalid"
    IMAGE_UNAVAILABLE = "ImageUnavailable"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    BOOTSTRAP_DATA_INVALID = "BootstrapDataInvalid"
    NETWORK_CONFLICT = "NetworkConflict"
    NETWORK_NOT_FOUND = "NetworkNotFound"
    BRIDGE_NOT_FOUND = "BridgeNotFound"
    STORAGE_UNAVAILABLE = "StorageUnavailable"
    NAME_COLLISION = "NameCollision"
    DOMAIN_NOT_RUNNING = "DomainNotRunning"
    DOMAIN_ERROR = "DomainError"
    FOREIGN_DOMAIN = "ForeignDomain"
    BOOTSTRAP_TIMED_OUT = "BootstrapTimedOut"
    """No bootstrap success file within --bootstrap-timeout; the message has the console tail."""
    # Reported after the controller repaired something done out of band.
    DOMAIN_RESTARTED = "DomainRestarted"
    DOMAIN_RECREATED = "DomainRecreated"
    CONTROL_PLANE_ENDPOINT_REQUIRED = "ControlPlaneEndpointRequired"
    """capl cannot publish a DNS name on this network (bridge mode): set the endpoint."""
    INVALID_SPEC = "InvalidSpec"
    # Live migration and host maintenance.
    MIGRATION_RUNNING = "MigrationRunning"
    MIGRATION_SUCCEEDED = "MigrationSucceeded"
    MIGRATION_FAILED = "MigrationFailed"
    MIGRATION_ABORTED = "MigrationAborted"
    NOT_MIGRATING = "NotMigrating"
    HARDWARE_APPLIED = "HardwareApplied"
    RESTART_REQUIRED = "RestartRequired"
    HARDWARE_UPDATE_FAILED = "HardwareUpdateFailed"
    HARDWARE_REVERTED = "HardwareReverted"
    NOT_IN_PLACE = "NotInPlace"
    NO_TARGET_HOST = "NoTargetHost"
    WAITING_FOR_MIGRATION = "WaitingForMigration"
    EVACUATING = "Evacuating"
    EVACUATED = "Evacuated"
    EVICTION_BLOCKED = "EvictionBlocked"
    """A machine with evictionStrategy None keeps the host's maintenance waiting."""
    LIBVIRT_ERROR = "LibvirtError"
    INTERNAL_ERROR = "InternalError"


class AddressType(StrEnum):
    """Cluster API machine address types."""

    HOSTNAME = "Hostname"
    INTERNAL_IP = "InternalIP"
    EXTERNAL_IP = "ExternalIP"
    INTERNAL_DNS = "InternalDNS"
    EXTERNAL_DNS = "ExternalDNS"
