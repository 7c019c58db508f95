"""capl.virt: the libvirt adapter, the only package that imports libvirt.

``LibvirtHosts`` implements ``capl.ports.virt.Hosts`` (one shared connection per host, a
process-wide libvirt event thread bridged to asyncio, typed errors); ``LibvirtHost``
implements ``capl.ports.virt.Host``. Module map:

- ``hosts``/``host``: the registry and the per-host facade (async);
- ``connection``: how a call runs: worker threads, serial keys, deadlines, the in-flight cap;
- ``handles``: which ``virConnect`` serves a call, lazy connect, keepalive, loss and reconnect
  with backoff, the event callbacks; ``counting``: libvirt calls per host and method;
  ``connecthints``: what a failed connect means in terms of the credentials Secret;
- ``events``: the libvirt event loop thread and the fan-out to asyncio loops;
- ``uri``: URI validation/redaction and credential files (ssh keys, known_hosts, TLS);
- ``storage``, ``network``, ``domain``, ``images``: blocking operations per object kind;
  ``network_hosts``: DHCP reservations and DNS records, decided on ``network_cache``;
- ``pools``: the storage pool drivers, one module per pool type behind ``pools.base.PoolDriver``
  (``pools.directory``: dir pools of file volumes); they write the pool and volume XML and
  each disk's ``<source>``;
- ``domainxml``, ``networkxml``, ``storagexml``, ``xmlutil``: typed XML builders/parsers;
- ``errors``, ``states``, ``support``: error mapping, state names, worker-thread helpers.
"""

from capl.virt.host import LibvirtHost
from capl.virt.hosts import LibvirtHosts

__all__ = ["LibvirtHost", "LibvirtHosts"]
