"""Properties a backend declares per device type: whether it is deterministic, batch-invariant,
or interpreted holds on some devices and not others (ATen's matmul is batch-invariant on the
CPU; on CUDA cuBLAS picks its kernel by the batch size), so each is declared for the device types
on which it holds, and asked for one device at a time.

A declaration is ``True`` (every device type), ``False`` (none) or a collection of device types
such as ``("cpu",)``; :func:`declared_on` turns it into the one stored form, :class:`DeviceTypes`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch


def device_type(device: torch.device | str) -> str:
    """The type of ``device``: a torch.device, a string such as ``"cuda:0"``, or a device type."""
    return device.type if isinstance(device, torch.device) else torch.device(device).type


@dataclass(frozen=True)
class DeviceTypes:
    """The device types on which a declared property holds: ``names``, or every device type
    when ``names`` is None. Ask it for one device (``device in types``, or the backend's
    ``is_...(device)`` methods): it has no truth value of its own, so a reader that asks
    ``if backend.deterministic:`` without a device is an error, not an answer for some device."""

    names: frozenset[str] | None

    def __contains__(self, device: torch.device | str) -> bool:
        return self.names is None or device_type(device) in self.names

    def __bool__(self) -> bool:
        raise TypeError(
            f"a property declared per device type ({self}) has no truth value: ask for a device, "
            "e.g. backend.is_deterministic(device) or 'cuda' in backend.deterministic"
        )

    def __str__(self) -> str:
        if self.names is None:
            return "every device type"
        return ", ".join(sorted(self.names)) if self.names else "no device type"


EVERY_DEVICE = DeviceTypes(None)
NO_DEVICE = DeviceTypes(frozenset())

#: What a property may be declared as: see :func:`declared_on`.
Declaration = bool | Collection[str] | DeviceTypes


def declared_on(owner: str, label: str, value: Declaration) -> DeviceTypes:
    """The device types ``value`` declares: True for every one, False for none, or a collection
    of device types (``("cpu", "cuda")``). A TypeError or ValueError naming ``owner`` and the
    argument ``label`` for anything else: a bare string, a device with an index (``"cuda:0"``),
    a name torch does not know as a device type."""
    if isinstance(value, DeviceTypes):
        return value
    if value is True or value is False:
        return EVERY_DEVICE if value else NO_DEVICE
    if isinstance(value, str) or not isinstance(value, Collection):
        raise TypeError(
            f"{owner}: {label} must be True (every device type), False (none) or a collection of "
            f"device types such as ('cpu',); got {value!r}"
        )
    names = set()
    for name in value:
        if not isinstance(name, str):
            raise TypeError(f"{owner}: {label} must name device types as str such as 'cuda'; got {name!r}")
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise ValueError(f"{owner}: {label}: {name!r} is not a device type ({err})") from None
        if device.index is not None or device.type != name:
            raise ValueError(
                f"{owner}: {label}: {name!r} names a device, not a device type: write {device.type!r}"
            )
        names.add(name)
    return DeviceTypes(frozenset(names))
