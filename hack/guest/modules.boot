# Kernel modules the test guest always loads, in this order (each module's own dependencies
# from modules.dep are put before it by hack/guest-image.sh). virtio_ring must precede virtio,
# the PCI transport the device drivers; qemu_fw_cfg exposes the Ignition file; button + evdev
# give acpid the ACPI power button; virtio_console the guest agent's virtio-serial port;
# virtio_balloon lets the domain's balloon set the guest's memory (memoryMiB below
# maxMemoryMiB, raised live), as a distribution's udev loads it.
virtio_ring
virtio
virtio_pci_legacy_dev
virtio_pci_modern_dev
virtio_pci
failover
net_failover
virtio_net
virtio_blk
qemu_fw_cfg
button
evdev
virtio_console
virtio_balloon
