"""The building blocks every capl API model is made of.

`K8sModel` fixes the conventions once:

- Python attributes are snake_case, the wire form is camelCase (an alias generator, plus an
  explicit alias where Kubernetes spells an initialism, e.g. `providerID`, `memoryMiB`).
  Models accept both spellings on input and produce the aliases on output.
- Unknown fields are ignored, so an older manager keeps parsing objects written against a
  newer CRD. The corollary: a parsed model is a *view* of an object, never a replacement for
  it. Write with patches of the fields you own, never with a PUT of a model dump.
- Attribute docstrings become field descriptions, which become the CRD's OpenAPI
  descriptions and therefore `kubectl explain`.
- `wire()` is the canonical wire form (JSON types only, aliases, no None); it is the same as
  `model_dump(by_alias=True, exclude_none=True)`.

The constraint types below (`DNSLabel`, `CIDR`, ...) carry their bounds and patterns in
pydantic metadata, so Python validation and the generated CRD schema are the same rules. The
patterns are written in the regular-expression subset shared by Python, Rust's `regex` (which
pydantic uses) and RE2 (which kube-apiserver uses): no look-around, no back-references.

Rules that only the API server can evaluate (CEL `x-kubernetes-validations`, list types) are
attached with `schema_extra()`/`cel()`/`map_list()`; crdgen copies them into the CRD verbatim.
Python models deliberately do not enforce transition rules (immutability) or cross-object
checks: those belong to the API server and the admission webhooks.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel


class K8sModel(BaseModel):
    """Base of all API models: camelCase aliases, unknown fields ignored, docstrings kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        use_attribute_docstrings=True,
        validate_assignment=False,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server reads it: aliases, JSON types, no None values."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- Time ------------------------------------------------------------------------------------


def _as_utc(value: datetime.datetime) -> datetime.datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=datetime.UTC)
    return value.astimezone(datetime.UTC)


def _format_time(value: datetime.datetime) -> str:
    return _as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time is written."""
    return _format_time(value)


Time = Annotated[
    datetime.datetime,
    AfterValidator(_as_utc),
    PlainSerializer(_format_time, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""metav1.Time: an aware UTC datetime in Python, RFC 3339 (`...Z`) on the wire."""


# --- Schema annotations that only the API server understands ---------------------------------

CELReason = Literal[
    "FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"
]


def cel(
    rule: str,
    message: str,
    *,
    field_path: str | None = None,
    reason: CELReason | None = None,
) -> dict[str, str]:
    """One `x-kubernetes-validations` entry. `message` must name the field it is about."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


def schema_extra(
    *,
    rules: Sequence[Mapping[str, str]] = (),
    list_map_keys: Sequence[str] = (),
    list_type: Literal["atomic", "set", "map"] | None = None,
    **other: Any,
) -> dict[str, Any]:
    """Extra OpenAPI keys for a field or model (`json_schema_extra=`)."""
    extra: dict[str, Any] = dict(other)
    if rules:
        extra["x-kubernetes-validations"] = [dict(r) for r in rules]
    if list_map_keys:
        extra["x-kubernetes-list-type"] = "map"
        extra["x-kubernetes-list-map-keys"] = list(list_map_keys)
    elif list_type is not None:
        extra["x-kubernetes-list-type"] = list_type
    return extra


def map_list(*keys: str) -> dict[str, Any]:
    """A list merged by server-side apply per item, keyed (and deduplicated) by `keys`."""
    return schema_extra(list_map_keys=keys)


def immutable_once_set(
    path: str, *, what: str | None = None, string: bool = True
) -> dict[str, str]:
    """A transition rule: the (optional) field at dotted `path` below `self` may be set once.

    Written against the parent object so that removing the field counts as a change too
    (a rule on the field itself never runs when the new object lacks it). For strings the
    empty string counts as unset.
    """
    parts = path.split(".")
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    old_has = " && ".join(f"has(oldSelf.{p})" for p in prefixes)
    new_has = " && ".join(f"has(self.{p})" for p in prefixes)
    old_unset = f"!({old_has})"
    if string:
        old_unset += f" || oldSelf.{path} == ''"
    rule = f"{old_unset} || ({new_has} && self.{path} == oldSelf.{path})"
    return cel(
        rule,
        f"{what or path} is immutable once set",
        field_path=f".{path}",
        reason="FieldValueForbidden",
    )


# --- Constrained strings ---------------------------------------------------------------------

_DNS_LABEL_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_IPV4_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"{_IPV4_OCTET}(\.{_IPV4_OCTET}){{3}}"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

DNS_LABEL_PATTERN = rf"^{_DNS_LABEL_RE}$"
DNS_SUBDOMAIN_PATTERN = rf"^{_DNS_LABEL_RE}(\.{_DNS_LABEL_RE})*$"
IPV4_PATTERN = rf"^{_IPV4}$"
# IPv4 network with a prefix length of 8..30 (a network needs room for a gateway and guests).
CIDR_PATTERN = rf"^{_IPV4}/([89]|[12][0-9]|30)$"
MAC_PATTERN = r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$"
SHA256_PATTERN = r"^sha256:[0-9a-f]{64}$"
UUID_PATTERN = rf"^{_UUID}$"
PROVIDER_ID_PATTERN = rf"^libvirt:///{_UUID}$"
# driver[+transport]://[user@][host[:port]]/path[?query]: qemu:///system, qemu+ssh://h/system,
# qemu+tls://h/system, test:///default, test+unix:///default.
# These three allow printable ASCII only ([!-~], i.e. no whitespace, no controls, no
# non-ASCII: percent-encode those). An explicit class, not `\s`: the API server's regex engine
# (RE2) reads `\s` as ASCII whitespace and pydantic's (Rust) as Unicode whitespace, so `[^\s]`
# would let the server store values the controllers cannot parse.
LIBVIRT_URI_PATTERN = r"^[a-z][a-z0-9]*(\+[a-z0-9]+)?://[!-.0-~]*/[!-~]*$"
HTTP_URL_PATTERN = r"^https?://[!-.0-~]+(/[!-~]*)?$"
ABSOLUTE_PATH_PATTERN = r"^/[!-~]*$"
# libvirt volume and network names: printable, no slash, no whitespace.
LIBVIRT_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"
# A Kubernetes label value (non-empty here): alphanumerics at both ends, '-', '_', '.' inside.
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# Linux interface names (IFNAMSIZ - 1 = 15 bytes).
BRIDGE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$"

DNSLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
"""RFC 1123 label: lower-case alphanumerics and '-', at most 63 characters."""

DNSSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""RFC 1123 subdomain: dot-separated labels, at most 253 characters."""

ObjectName = DNSSubdomain
"""A Kubernetes object name (Secrets and most kinds are DNS subdomains)."""

IPv4Address = Annotated[str, Field(min_length=7, max_length=15, pattern=IPV4_PATTERN)]
IPv4CIDR = Annotated[str, Field(min_length=9, max_length=18, pattern=CIDR_PATTERN)]
MACAddress = Annotated[str, Field(min_length=17, max_length=17, pattern=MAC_PATTERN)]
SHA256Checksum = Annotated[str, Field(min_length=71, max_length=71, pattern=SHA256_PATTERN)]
UUID = Annotated[str, Field(min_length=36, max_length=36, pattern=UUID_PATTERN)]
ProviderID = Annotated[str, Field(min_length=47, max_length=47, pattern=PROVIDER_ID_PATTERN)]
LibvirtURI = Annotated[str, Field(min_length=6, max_length=1024, pattern=LIBVIRT_URI_PATTERN)]
HTTPURL = Annotated[str, Field(min_length=8, max_length=2048, pattern=HTTP_URL_PATTERN)]
AbsolutePath = Annotated[str, Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH_PATTERN)]
LibvirtName = Annotated[str, Field(min_length=1, max_length=200, pattern=LIBVIRT_NAME_PATTERN)]
BridgeName = Annotated[str, Field(min_length=1, max_length=15, pattern=BRIDGE_PATTERN)]

LabelValue = Annotated[str, Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)]
"""A Kubernetes label value: at most 63 characters, alphanumerics at both ends."""

SizeGiB = Annotated[int, Field(ge=1, le=65536)]
"""A disk size in GiB, 1 GiB .. 64 TiB."""

StringMap = dict[str, Annotated[str, Field(max_length=4096)]]
