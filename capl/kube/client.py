"""The Kubernetes API client: capl.runtime's `Client` Protocol on kubernetes_asyncio.

kubernetes_asyncio provides the configuration loaders (kubeconfig, exec/OIDC tokens, in-cluster)
and the TLS-configured aiohttp session; requests go straight through that session with JSON
encoded/decoded here by orjson (no model deserialisation: objects stay raw dicts, which is both
what the runtime wants and several times faster). Every request is counted in `RequestStats`
(rest_client_requests_total{code,method,host}) and, when `track_objects` is on, per object.

Plain requests (everything but watches) go through `capl.kube.http.HttpPool`, a lean
keep-alive HTTP/1.1 pool on asyncio streams with the same TLS settings as kubernetes_asyncio's
connector: it costs less than half the CPU of an aiohttp request. Watches, and every request
when a proxy is configured, go through a session of our own on kubernetes_asyncio's connector
with `trust_env` off: aiohttp's trust_env costs two thread-pool round trips per request (proxy
and .netrc lookups). The proxy environment (HTTPS_PROXY, NO_PROXY...) is read once when the
client is built and applied to every request instead.

Watches stream newline-delimited JSON; a socket read timeout turns a silent connection into
`WatchStalled`, an ERROR event or a 410 answer into `Gone`, connection failures into
`TransportError`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient, Configuration

from capl.kube.config import load_configuration
from capl.kube.http import HttpPool
from capl.runtime.client import ObjectList, WatchEvent
from capl.runtime.errors import ApiError, Gone, TransportError, WatchStalled, error_for
from capl.runtime.metrics import RequestStats
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import Resource

MERGE_PATCH = "application/merge-patch+json"
_JSON = "application/json"
_WATCH_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


class _TokenBucket:
    """Optional client-side rate limit (client-go's QPS/Burst)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.qps)


class KubeClient:
    """`capl.runtime.client.Client` for a real API server."""

    def __init__(
        self,
        configuration: Configuration,
        *,
        pool_size: int = 128,
        track_objects: bool = False,
        qps: float | None = None,
        burst: int = 100,
        user_agent: str = "capl",
        request_timeout: float = 60.0,
    ) -> None:
        configuration.connection_pool_maxsize = pool_size
        self.configuration = configuration
        self.api_client = ApiClient(configuration)
        shared: aiohttp.ClientSession = self.api_client.rest_client.pool_manager
        self._session = aiohttp.ClientSession(
            connector=shared.connector,
            connector_owner=False,
            trust_env=False,
            read_bufsize=2**21,
        )
        self._host = str(configuration.host).rstrip("/")
        self.stats = RequestStats(host=urlsplit(self._host).netloc, track_objects=track_objects)
        self._headers = {"Accept": _JSON, "User-Agent": user_agent}
        self._request_kwargs: dict[str, Any] = {}
        if configuration.tls_server_name:
            self._request_kwargs["server_hostname"] = configuration.tls_server_name
        proxy = configuration.proxy or _env_proxy(self._host)
        if proxy:
            self._request_kwargs["proxy"] = proxy
        self._dynamic_auth = bool(configuration.api_key) or bool(configuration.refresh_api_key_hook)
        self._limiter = _TokenBucket(qps, burst) if qps else None
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10.0, sock_read=request_timeout
        )
        self._request_timeout = request_timeout
        self._pool = None if proxy else _lean_pool(configuration, self._host, pool_size)
        self._resources: dict[Resource, KubeResourceClient] = {}

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        **kwargs: Any,
    ) -> KubeClient:
        """Load the configuration (see capl.kube.config) and build a client."""
        configuration, _source = await load_configuration(kubeconfig, context=context)
        return cls(configuration, **kwargs)

    def resource(self, resource: Resource) -> KubeResourceClient:
        client = self._resources.get(resource)
        if client is None:
            client = self._resources[resource] = KubeResourceClient(self, resource)
        return client

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        await self._session.close()
        await self.api_client.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transport ---------------------------------------------------------------------------

    async def _headers_for(self, content_type: str | None) -> dict[str, str]:
        headers = dict(self._headers)
        if content_type:
            headers["Content-Type"] = content_type
        if self._dynamic_auth:
            token = await self.configuration.get_api_key_with_prefix("BearerToken")
            if token:
                headers["Authorization"] = token
        if self.configuration.username and self.configuration.password:
            headers["Authorization"] = self.configuration.get_basic_auth_token()
        return headers

    async def _prepare(
        self, path: str, query: Mapping[str, str] | None, body: Any, content_type: str | None
    ) -> tuple[str, bytes | None, dict[str, str]]:
        """After the rate limit (if any): the request target (path and query), the encoded
        body and the headers, for either transport."""
        if self._limiter is not None:
            await self._limiter.take()
        target = path + "?" + urlencode(query) if query else path
        data = None if body is None else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        headers = await self._headers_for(content_type if data is not None else None)
        return target, data, headers

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        target, data, headers = await self._prepare(path, query, body, content_type)
        try:
            return await self._session.request(
                method,
                self._host + target,
                data=data,
                headers=headers,
                timeout=client_timeout or self._timeout,
                **self._request_kwargs,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = _JSON,
        resource: Resource | None = None,
        key: ObjectKey | None = None,
        subresource: str = "",
    ) -> Any:
        """One request; the decoded JSON answer, or a typed ApiError."""
        started = time.perf_counter()
        code = 0
        try:
            if self._pool is not None:
                code, payload = await self._lean(method, path, query, body, content_type)
            else:
                code, payload = await self._via_aiohttp(method, path, query, body, content_type)
        finally:
            self.stats.record(
                method,
                code,
                resource=resource,
                key=key,
                subresource=subresource,
                duration=time.perf_counter() - started,
            )
        if code >= 300:
            raise _error(code, payload)
        return orjson.loads(payload) if payload else None

    async def _lean(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
    ) -> tuple[int, bytes]:
        assert self._pool is not None
        target, data, headers = await self._prepare(path, query, body, content_type)
        try:
            return await self._pool.request(
                method, target, headers, data, read_timeout=self._request_timeout
            )
        except (TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc

    async def _via_aiohttp(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
    ) -> tuple[int, bytes]:
        response = await self._send(method, path, query=query, body=body, content_type=content_type)
        try:
            payload = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        finally:
            response.release()
        return response.status, payload


def _lean_pool(configuration: Configuration, host: str, limit: int) -> HttpPool | None:
    """The lean pool for `host` with kubernetes_asyncio's TLS settings (its rest client
    builds the same context for its connector); None for a URL it does not serve."""
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    context: ssl.SSLContext | None = None
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if configuration.disable_strict_ssl_verification:
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return HttpPool(
        parts.hostname,
        parts.port or (443 if parts.scheme == "https" else 80),
        ssl_context=context,
        server_hostname=configuration.tls_server_name or None,
        limit=limit,
    )


def _env_proxy(host: str) -> str | None:
    """The proxy the environment names for the API server's URL (HTTPS_PROXY / HTTP_PROXY,
    honouring NO_PROXY), read once; None for a direct connection."""
    parts = urlsplit(host)
    proxy = getproxies().get(parts.scheme)
    if not proxy or (parts.hostname and proxy_bypass(parts.hostname)):
        return None
    return str(proxy)


def _error(code: int, payload: bytes) -> ApiError:
    reason = message = ""
    try:
        status = orjson.loads(payload)
        if isinstance(status, dict):
            reason = str(status.get("reason") or "")
            message = str(status.get("message") or "")
    except ValueError:
        message = payload[:200].decode(errors="replace")
    return error_for(code, reason, message)


class KubeResourceClient:
    """`capl.runtime.client.ResourceClient` for one resource."""

    def __init__(self, client: KubeClient, resource: Resource) -> None:
        self._client = client
        self._resource = resource
        prefix = f"/apis/{resource.group}/{resource.version}" if resource.group else "/api/v1"
        self._prefix = prefix

    @property
    def resource(self) -> Resource:
        return self._resource

    def _collection(self, namespace: str | None) -> str:
        if self._resource.namespaced and namespace:
            return f"{self._prefix}/namespaces/{quote(namespace, safe='')}/{self._resource.plural}"
        return f"{self._prefix}/{self._resource.plural}"

    def _path(self, key: ObjectKey, subresource: str = "") -> str:
        if self._resource.namespaced and not key.namespace:
            raise ValueError(f"{self._resource.kind} is namespaced: key {key!r} has no namespace")
        path = f"{self._collection(key.namespace)}/{quote(key.name, safe='')}"
        return f"{path}/{subresource}" if subresource else path

    async def get(self, key: ObjectKey) -> Obj:
        result: Obj = await self._client.request(
            "GET", self._path(key), resource=self._resource, key=key
        )
        return result

    async def list(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
    ) -> ObjectList:
        items: list[Obj] = []
        path = self._collection(namespace)
        cont = ""
        api_version, kind = self._resource.api_version, self._resource.kind
        while True:
            query: dict[str, str] = {}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            if limit:
                query["limit"] = str(limit)
            if cont:
                query["continue"] = cont
            page = await self._client.request("GET", path, query=query, resource=self._resource)
            for item in page.get("items") or ():
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            metadata = page.get("metadata") or {}
            cont = metadata.get("continue") or ""
            if not cont:
                return ObjectList(items=items, resource_version=metadata.get("resourceVersion", ""))

    async def watch(
        self,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        inactivity_timeout: float | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        client = self._client
        query: dict[str, str] = {"watch": "true"}
        if resource_version:
            query["resourceVersion"] = resource_version
        if allow_bookmarks:
            query["allowWatchBookmarks"] = "true"
        if timeout_seconds:
            query["timeoutSeconds"] = str(int(timeout_seconds))
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        path = self._collection(namespace)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=inactivity_timeout)
        started = time.perf_counter()
        try:
            response = await client._send("GET", path, query=query, client_timeout=timeout)
        except TransportError:
            client.stats.record("WATCH", 0, resource=self._resource)
            raise
        client.stats.record(
            "WATCH",
            response.status,
            resource=self._resource,
            duration=time.perf_counter() - started,
        )
        try:
            if response.status != 200:
                payload = await response.read()
                raise _error(response.status, payload)
            buffer = bytearray()
            async for chunk in response.content.iter_any():
                buffer += chunk
                while True:
                    end = buffer.find(b"\n")
                    if end < 0:
                        break
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        yield _watch_event(line)
        except TimeoutError as exc:
            raise WatchStalled(f"watch {path}: silent for {inactivity_timeout}s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise TransportError(f"watch {path}: {exc!r}") from exc
        finally:
            response.close()

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        namespace = (obj.get("metadata") or {}).get("namespace")
        name = (obj.get("metadata") or {}).get("name") or ""
        result: Obj = await self._client.request(
            "POST",
            self._collection(namespace),
            body=obj,
            resource=self._resource,
            key=ObjectKey(namespace or "", name),
        )
        return result

    async def _patch(
        self,
        key: ObjectKey,
        patch: Mapping[str, Any],
        resource_version: str | None,
        subresource: str,
    ) -> Obj:
        body: Any = patch
        if resource_version:
            body = dict(patch)
            metadata = dict(body.get("metadata") or {})
            metadata["resourceVersion"] = resource_version
            body["metadata"] = metadata
        result: Obj = await self._client.request(
            "PATCH",
            self._path(key, subresource),
            body=body,
            content_type=MERGE_PATCH,
            resource=self._resource,
            key=key,
            subresource=subresource,
        )
        return result

    async def patch(
        self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Obj:
        return await self._patch(key, patch, resource_version, "")

    async def patch_status(
        self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Obj:
        return await self._patch(key, patch, resource_version, "status")

    async def delete(
        self,
        key: ObjectKey,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
    ) -> Obj | None:
        body: dict[str, Any] | None = None
        if uid or resource_version or propagation_policy:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            preconditions = {}
            if uid:
                preconditions["uid"] = uid
            if resource_version:
                preconditions["resourceVersion"] = resource_version
            if preconditions:
                body["preconditions"] = preconditions
            if propagation_policy:
                body["propagationPolicy"] = propagation_policy
        result = await self._client.request(
            "DELETE", self._path(key), body=body, resource=self._resource, key=key
        )
        if isinstance(result, dict) and result.get("kind") != "Status":
            return result
        return None


def _watch_event(line: bytes) -> WatchEvent:
    try:
        event = orjson.loads(line)
    except ValueError as exc:
        raise TransportError(f"undecodable watch event: {line[:100]!r}") from exc
    kind = event.get("type")
    obj = event.get("object") or {}
    if kind == "ERROR":
        code = int(obj.get("code") or 500)
        error = error_for(code, str(obj.get("reason") or ""), str(obj.get("message") or ""))
        if code == 410 or obj.get("reason") in ("Expired", "Gone"):
            raise Gone(410, str(obj.get("reason") or "Expired"), str(obj.get("message") or ""))
        raise error
    if kind not in _WATCH_EVENT_TYPES:
        raise TransportError(f"unknown watch event type {kind!r}")
    return WatchEvent(kind, obj)
