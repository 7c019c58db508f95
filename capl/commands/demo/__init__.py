"""`capl demo`: capl's main job on this machine, in one command, and nothing left afterwards.

It runs, all owned by this one process, a local control plane (etcd + kube-apiserver), the
Cluster API core manager and capl's manager, then a demo cluster on one libvirt host
(``--libvirt-uri``) with an isolated network on a free /24 and a directory pool in its work
directory, in one of two modes:

- **real nodes** (the default): Cluster API's kubeadm bootstrap provider runs beside the core
  manager, the workload cluster's control plane runs on this machine on the network's host
  address, and N workers of the node image (``--node-image``) join it: a MachineDeployment
  bootstrapped with Ignition and one with cloud-config;
- **VM-only** (``--vm-only``; implied by the test driver, which boots no guests): one
  control-plane Machine bootstrapped with Ignition and a MachineDeployment of N-1 workers
  bootstrapped with cloud-config, of the test guest (no kubelet), whose base image the demo
  serves from loopback.

Then a live view of the machines until all are done (``N/N machines Ready``, with real nodes
``N/N Nodes Ready``), the commands to try, and on SIGINT or SIGTERM a clean-up that removes
everything the demo created; a killed demo's leftovers are removed by the next one.

The modules, in the order a run uses them:

- ``cli``: the flags, the defaults that depend on the mode, the exit code;
- ``plan``: ``DemoOptions`` and ``DemoPlan``, the names and the network (pure);
- ``assets``: the binaries, builds and node image, found before anything starts;
- ``workdirs``: work directories and their owners (``demo.json``);
- ``network``: the demo network, a /24 free on the host;
- ``image_server``: the VM-only base image, served on loopback;
- ``objects`` and ``node_objects``: the API objects of either mode (pure);
- ``state``, ``lifecycle``: what a run started, and ``Demo`` that starts it;
- ``real_nodes``: the bootstrap provider and the workload control plane of real nodes;
- ``view``, ``node_view``, ``ui``: the rows of the live view, the Nodes, the output;
- ``cleanup`` and ``leftovers``: removing everything, through the API and then the host.
"""

from __future__ import annotations

from capl.commands.demo.cli import register

__all__ = ["register"]
