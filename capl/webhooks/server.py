"""The admission webhook server: AdmissionReview v1 over HTTPS, served by aiohttp.

`create_app()` returns an aiohttp `web.Application` with one route per entry of
`capl.api.admission.WEBHOOKS`; `WebhookServer` runs it over TLS with the certificate pair
from a directory (`tls.crt`, `tls.key`, as cert-manager writes into the mounted Secret).
Certificates are reloaded when the files change: every TLS handshake reads the two files
(a few kilobytes) and switches to a fresh SSLContext when they differ, so a renewed certificate is
served without a restart.

Two lookups are injected by the manager, behind Protocols (this package must not import
the Kubernetes client): the list of LibvirtClusters for the overlap check, and the virtual
size of a machine's image when something already knows it. Both are optional: without them
the checks that need them are skipped, never failed.

Failure semantics: a mutating webhook that cannot parse an object allows it unchanged (the
API server validates the schema *after* mutating admission and will report the real
problem); a validating webhook denies what it cannot parse, naming the field.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import pydantic
from aiohttp import web

from capl.api import (
    GROUP,
    LibvirtCluster,
    LibvirtClusterTemplate,
    LibvirtMachine,
    LibvirtMachineSpec,
    LibvirtMachineTemplate,
)
from capl.api.admission import WEBHOOKS, WebhookSpec
from capl.api.base import K8sModel
from capl.api.constants import Kind
from capl.api.defaults import default_libvirt_cluster, default_libvirt_machine
from capl.webhooks.patch import json_patch
from capl.webhooks.validation import (
    FieldError,
    Verdict,
    validate_libvirt_cluster,
    validate_libvirt_cluster_template,
    validate_libvirt_machine,
    validate_libvirt_machine_template,
)

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8 * 1024 * 1024
CERT_NAME = "tls.crt"
KEY_NAME = "tls.key"


class LibvirtClusterLister(Protocol):
    """Lists every LibvirtCluster (all namespaces), e.g. from the manager's informer cache."""

    async def list_libvirt_clusters(self) -> Sequence[LibvirtCluster]: ...


class ImageSizeLookup(Protocol):
    """The virtual size in bytes of the image a machine spec names, when already known."""

    async def image_virtual_size(
        self, *, namespace: str, spec: LibvirtMachineSpec
    ) -> int | None: ...


# --- AdmissionReview -------------------------------------------------------------------------


class GroupVersionKind(K8sModel):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(K8sModel):
    uid: str
    kind: GroupVersionKind = pydantic.Field(default_factory=GroupVersionKind)
    name: str | None = None
    namespace: str | None = None
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool = False


class AdmissionReview(K8sModel):
    api_version: str = "admission.k8s.io/v1"
    kind: str = "AdmissionReview"
    request: AdmissionRequest


@dataclass(frozen=True, kw_only=True)
class Response:
    """What a handler decided; rendered into AdmissionReview.response."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    warnings: tuple[str, ...] = ()
    patch: list[dict[str, Any]] | None = None
    causes: tuple[FieldError, ...] = ()
    """The field errors of a denial, rendered as `status.details.causes` (as Kubernetes'
    own Invalid errors): clients that show only the causes, like Cluster API's topology
    controller in its TopologyReconciled condition, still name the field."""

    def render(self, uid: str, *, kind: str = "", name: str = "") -> dict[str, Any]:
        response: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            status: dict[str, Any] = {
                "code": self.code,
                "message": self.message,
                "reason": self.reason or "Invalid",
            }
            if self.causes:
                status["details"] = {
                    "group": GROUP,
                    "kind": kind,
                    "name": name,
                    "causes": [
                        {"reason": "FieldValueInvalid", "field": c.path, "message": c.message}
                        for c in self.causes
                    ],
                }
            response["status"] = status
        if self.warnings:
            response["warnings"] = list(self.warnings)
        if self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(self.patch).encode()).decode()
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }


def _verdict_response(verdict: Verdict) -> Response:
    if verdict.allowed:
        return Response(allowed=True, warnings=tuple(verdict.warnings))
    return Response(
        allowed=False,
        code=422,
        reason="Invalid",
        message=verdict.message(),
        warnings=tuple(verdict.warnings),
        causes=tuple(verdict.errors),
    )


def _parse_error(exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        problems.append(f"{path}: {err['msg']}")
    return "; ".join(problems)


M = TypeVar("M", bound=K8sModel)


def _parse(model: type[M], raw: dict[str, Any] | None) -> M | None:
    return None if raw is None else model.model_validate(raw)


Handler = Callable[[AdmissionRequest], Awaitable[Response]]


def _being_deleted(raw: dict[str, Any]) -> bool:
    metadata = raw.get("metadata")
    return isinstance(metadata, dict) and bool(metadata.get("deletionTimestamp"))


class Admission:
    """The admission logic per webhook, independent of HTTP."""

    def __init__(
        self,
        *,
        clusters: LibvirtClusterLister | None = None,
        images: ImageSizeLookup | None = None,
    ) -> None:
        self._clusters = clusters
        self._images = images

    def handler(self, spec: WebhookSpec) -> Handler:
        table: dict[tuple[Kind, bool], Handler] = {
            (Kind.LIBVIRT_CLUSTER, True): self.default_cluster,
            (Kind.LIBVIRT_MACHINE, True): self.default_machine,
            (Kind.LIBVIRT_CLUSTER, False): self.validate_cluster,
            (Kind.LIBVIRT_MACHINE, False): self.validate_machine,
            (Kind.LIBVIRT_CLUSTER_TEMPLATE, False): self.validate_cluster_template,
            (Kind.LIBVIRT_MACHINE_TEMPLATE, False): self.validate_machine_template,
        }
        return table[(spec.kind, spec.mutating)]

    async def _image_size(self, namespace: str | None, spec: LibvirtMachineSpec) -> int | None:
        if self._images is None:
            return None
        return await self._images.image_virtual_size(namespace=namespace or "", spec=spec)

    # Mutating.

    async def default_cluster(self, request: AdmissionRequest) -> Response:
        return self._default(
            request,
            LibvirtCluster,
            lambda c: default_libvirt_cluster(c, namespace=request.namespace),
        )

    async def default_machine(self, request: AdmissionRequest) -> Response:
        return self._default(request, LibvirtMachine, default_libvirt_machine)

    def _default(
        self, request: AdmissionRequest, model: type[M], default: Callable[[M], M]
    ) -> Response:
        raw = request.object
        if raw is None:
            return Response(allowed=True)
        try:
            parsed = model.model_validate(raw)
        except pydantic.ValidationError:
            # Schema validation runs after mutating admission and reports it properly.
            return Response(allowed=True)
        defaulted = default(parsed)
        patch = json_patch(raw, parsed.wire(), defaulted.wire())
        return Response(allowed=True, patch=patch or None)

    # Validating.

    async def validate_cluster(self, request: AdmissionRequest) -> Response:
        new = _parse(LibvirtCluster, request.object)
        old = _parse(LibvirtCluster, request.old_object)
        assert new is not None
        if new.metadata.namespace is None:
            new.metadata.namespace = request.namespace
        others: Sequence[LibvirtCluster] = ()
        if self._clusters is not None:
            others = await self._clusters.list_libvirt_clusters()
        return _verdict_response(validate_libvirt_cluster(new, old=old, others=others))

    async def validate_machine(self, request: AdmissionRequest) -> Response:
        new = _parse(LibvirtMachine, request.object)
        old = _parse(LibvirtMachine, request.old_object)
        assert new is not None
        size = await self._image_size(request.namespace, new.spec)
        return _verdict_response(validate_libvirt_machine(new, old=old, image_size=size))

    async def validate_machine_template(self, request: AdmissionRequest) -> Response:
        new = _parse(LibvirtMachineTemplate, request.object)
        old = _parse(LibvirtMachineTemplate, request.old_object)
        assert new is not None
        size = await self._image_size(request.namespace, new.spec.template.spec)
        verdict = validate_libvirt_machine_template(
            new, old=old, dry_run=request.dry_run, image_size=size
        )
        return _verdict_response(verdict)

    async def validate_cluster_template(self, request: AdmissionRequest) -> Response:
        new = _parse(LibvirtClusterTemplate, request.object)
        old = _parse(LibvirtClusterTemplate, request.old_object)
        assert new is not None
        verdict = validate_libvirt_cluster_template(new, old=old, dry_run=request.dry_run)
        return _verdict_response(verdict)

    async def review(self, spec: WebhookSpec, body: Any) -> dict[str, Any]:
        """Answer one AdmissionReview (already decoded from JSON)."""
        try:
            review = AdmissionReview.model_validate(body)
        except pydantic.ValidationError as e:
            raise web.HTTPBadRequest(text=f"not an AdmissionReview v1: {_parse_error(e)}") from e
        request = review.request
        wrong_group = bool(request.kind.group) and request.kind.group != GROUP
        wrong_kind = bool(request.kind.kind) and request.kind.kind != spec.kind
        if wrong_group or wrong_kind:
            response = Response(
                allowed=False,
                code=400,
                reason="BadRequest",
                message=f"this webhook handles {spec.kind}, not {request.kind.kind}",
            )
        elif request.operation not in spec.operations or request.object is None:
            response = Response(allowed=True)
        elif not spec.mutating and _being_deleted(request.object):
            # Only finalizers change now; never stand between an object and its deletion.
            response = Response(allowed=True)
        else:
            try:
                response = await self.handler(spec)(request)
            except pydantic.ValidationError as e:
                response = Response(allowed=False, code=422, message=_parse_error(e))
        log.debug(
            "admission %s %s %s/%s: allowed=%s %s",
            spec.path,
            request.operation,
            request.namespace,
            request.name,
            response.allowed,
            response.message,
        )
        return response.render(request.uid, kind=spec.kind, name=request.name or "")


def create_app(
    *,
    clusters: LibvirtClusterLister | None = None,
    images: ImageSizeLookup | None = None,
) -> web.Application:
    """An aiohttp application serving every capl webhook at its path (POST, JSON)."""
    admission = Admission(clusters=clusters, images=images)
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)

    def route(spec: WebhookSpec) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            if request.content_type != "application/json":
                raise web.HTTPUnsupportedMediaType(text="expected application/json")
            try:
                body = await request.json()
            except ValueError as e:
                raise web.HTTPBadRequest(text=f"invalid JSON: {e}") from e
            return web.json_response(await admission.review(spec, body))

        return handle

    for spec in WEBHOOKS:
        app.router.add_post(spec.path, route(spec))
    return app


# --- TLS -------------------------------------------------------------------------------------


def _stamp(paths: Sequence[Path]) -> bytes:
    """The files' contents: robust against coarse mtimes and the symlink swaps of Secret
    volumes, and cheap for a few kilobytes."""
    return b"\0".join(path.read_bytes() for path in paths)


class ReloadingTLS:
    """A server SSLContext that picks up a renewed certificate pair on the next handshake."""

    def __init__(self, *, cert_dir: Path, cert_name: str = CERT_NAME, key_name: str = KEY_NAME):
        self.cert_file = cert_dir / cert_name
        self.key_file = cert_dir / key_name
        self._stamp = _stamp((self.cert_file, self.key_file))
        self._current = self._load()
        # The listening context: its only job is to hand each handshake to the current one.
        self.context = self._load()
        self.context.sni_callback = self._on_hello

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def _on_hello(
        self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, ctx: ssl.SSLContext
    ) -> int | None:
        try:
            stamp = _stamp((self.cert_file, self.key_file))
            if stamp != self._stamp:
                self._current = self._load()
                self._stamp = stamp
                log.info("webhook serving certificate reloaded from %s", self.cert_file)
        except (OSError, ssl.SSLError) as e:
            # Half-written files during a rotation: keep serving the previous pair.
            log.warning("webhook certificate reload failed, keeping the old one: %s", e)
        sock.context = self._current
        return None


class WebhookServer:
    """Runs the webhook application over HTTPS until stopped.

    server = WebhookServer(app=create_app(...), cert_dir=Path(...), port=9443)
    await server.start()      # bound and serving; server.port is the real port
    ...
    await server.stop()
    """

    def __init__(
        self,
        *,
        app: web.Application,
        cert_dir: Path,
        host: str = "0.0.0.0",
        port: int = 9443,
        cert_name: str = CERT_NAME,
        key_name: str = KEY_NAME,
    ) -> None:
        self._app = app
        self._cert_dir = cert_dir
        self._host = host
        self._port = port
        self._cert_name = cert_name
        self._key_name = key_name
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port=0)."""
        if self._site is None or self._runner is None:
            raise RuntimeError("the webhook server is not running")
        for address in self._runner.addresses:
            return int(address[1])
        raise RuntimeError("the webhook server has no bound address")

    async def start(self) -> None:
        tls = ReloadingTLS(
            cert_dir=self._cert_dir, cert_name=self._cert_name, key_name=self._key_name
        )
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, ssl_context=tls.context)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        log.info("webhook server listening on https://%s:%d", self._host, self.port)

    async def stop(self) -> None:
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> WebhookServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
