"""ElementTree helpers shared by the libvirt XML builders and parsers.

Builders never format XML as strings: values go into element text and attributes, so
ElementTree escapes ``<``, ``&`` and quotes. What ElementTree cannot do is make control
characters legal (XML 1.0 forbids most of them, and libvirt rejects the document), so every
value passes through ``text()``/``line()`` first, which raise ``InvalidSpec`` naming the field.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from capl.ports.errors import InvalidSpec
from capl.ports.virt import CAPL_XML_NAMESPACE, CAPL_XML_PREFIX

__all__ = [
    "capl_tag",
    "child_text",
    "line",
    "parse",
    "serialize",
    "sub",
    "text",
]

ET.register_namespace(CAPL_XML_PREFIX, CAPL_XML_NAMESPACE)

# Characters XML 1.0 does not allow at all, plus the C0/C1 controls we do not want even
# where XML would tolerate them. Tab/newline are allowed only in free text (``text``).
_ILLEGAL_ANYWHERE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_LINE_BREAKS = re.compile("[\t\n\r]")
_CARRIAGE_RETURN = re.compile("\r")


def text(value: str, *, field: str) -> str:
    """A free-text value (descriptions): tabs and newlines allowed, other controls not.

    A carriage return is refused too: XML parsers normalise it to a line feed, so the value
    would not read back as written."""
    match = _ILLEGAL_ANYWHERE.search(value) or _CARRIAGE_RETURN.search(value)
    if match:
        raise InvalidSpec(
            f"{field} contains the control character U+{ord(match.group()):04X}, "
            "which cannot be written to libvirt XML"
        )
    return value


def line(value: str, *, field: str) -> str:
    """A single-line value (names, titles, paths, hostnames): no control characters."""
    text(value, field=field)
    if _LINE_BREAKS.search(value):
        raise InvalidSpec(f"{field} must be a single line without tabs or line breaks")
    if not value:
        raise InvalidSpec(f"{field} must not be empty")
    return value


def capl_tag(local: str) -> str:
    return f"{{{CAPL_XML_NAMESPACE}}}{local}"


def sub(parent: ET.Element, tag: str, value: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrs)
    if value is not None:
        element.text = value
    return element


def serialize(root: ET.Element, *, pretty: bool = True) -> str:
    """Stable serialization: pretty for people and golden files (compared byte for byte);
    ``pretty=False`` for a document only libvirt reads (indenting a domain definition was a
    third of its build time)."""
    if pretty:
        ET.indent(ET.ElementTree(root), space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def parse(document: str) -> ET.Element:
    try:
        return ET.fromstring(document)
    except ET.ParseError as exc:
        raise InvalidSpec(f"libvirt returned XML that does not parse: {exc}") from None


def child_text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    found = element.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()
