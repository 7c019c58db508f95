"""capl.virt: the libvirt adapter, the only package that imports libvirt.

``LibvirtHosts`` implements ``capl.ports.virt.Hosts`` (one shared connection per host, a
process-wide libvirt event thread bridged to asyncio, typed errors); ``LibvirtHost``
implements ``capl.ports.virt.Host``. Module map:

- ``hosts``/``host``: the registry and the per-host facade (async);
- ``connection``: lazy connect, keepalive, reconnect with backoff, call counting;
- ``events``: the libvirt event loop thread and the fan-out to asyncio loops;
- ``uri``: URI validation/redaction and credential files (ssh keys, known_hosts, TLS);
- ``storage``, ``network``, ``domain``, ``images``: blocking operations per object kind;
- ``domainxml``, ``networkxml``, ``storagexml``, ``xmlutil``: typed XML builders/parsers;
- ``errors``, ``states``, ``support``: error mapping, state names, worker-thread helpers.
"""

from capl.virt.host import LibvirtHost
from capl.virt.hosts import LibvirtHosts

__all__ = ["LibvirtHost", "LibvirtHosts"]
