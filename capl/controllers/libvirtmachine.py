"""The old path of the LibvirtMachine controller, kept for code outside the controllers that
still imports it (`capl.commands.demo`); it is the package `capl.controllers.machine` now.
New code imports that package."""

from __future__ import annotations

from capl.controllers.machine import (
    CONTROLLER_NAME,
    LibvirtMachineReconciler,
    MachineOptions,
    setup,
)

__all__ = ["CONTROLLER_NAME", "LibvirtMachineReconciler", "MachineOptions", "setup"]
