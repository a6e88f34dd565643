"""The Kubernetes API's own rules for the values a job spec and a pool hand to it: object names,
label values, resource names and quantities, image references.

Checked when a spec or pool is loaded, so a value the API server would refuse (or one that leaves
a pod Pending for ever) fails before anything is created, naming its field.  Standard library
only.  See docs/ARCHITECTURE.md, "Failure rules".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

__all__ = [
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "IMAGE_REFERENCE",
    "QUANTITY",
    "dns_label_problem",
    "dns_subdomain_problem",
    "image_problem",
    "parse_quantity",
    "requests_gpu",
    "resource_problem",
]

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS_LABEL = rf"^{_LABEL}$"  # RFC 1123 label: namespaces; at most 63 characters
DNS_SUBDOMAIN = rf"^{_LABEL}(?:\.{_LABEL})*$"  # RFC 1123 subdomain: most object names; at most 253

# [registry[:port]/]repository[:tag][@digest], the grammar of container image references
# (a lower-case repository; the tag at most 128 characters; a digest algorithm:hex).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
IMAGE_REFERENCE = (
    rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)

# The Kubernetes quantity grammar, non-negative: a number, then a binary suffix (Ki .. Ei), a
# decimal suffix (m, k, M, G, T, P, E) or a decimal exponent (e3, E-2).
QUANTITY = r"^\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[eE][-+]?[0-9]+|m|k|M|G|T|P|E)?$"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
            "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18}
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_EXTENDED = re.compile(rf"^({_LABEL}(?:\.{_LABEL})*)/([A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)$")


def dns_label_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 label (a namespace name), or None."""
    if len(value) > 63 or not re.match(DNS_LABEL, value):
        return (
            f"{value!r} is not a DNS-1123 label: at most 63 characters, lower-case letters, digits and "
            "'-', starting and ending with a letter or digit"
        )
    return None


def dns_subdomain_problem(value: str, max_length: int = 253) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (most object names) of at most ``max_length``, or None."""
    if len(value) > max_length or not re.match(DNS_SUBDOMAIN, value):
        return (
            f"{value!r} is not a DNS-1123 subdomain: at most {max_length} characters, lower-case letters, "
            "digits, '-' and '.', starting and ending with a letter or digit"
        )
    return None


def image_problem(value: str) -> str | None:
    """Why ``value`` is not a container image reference, or None."""
    if not value.strip():
        return "must not be empty: name the trainer image, e.g. registry.example.com/hetero-trainer:0.1.0"
    if not re.match(IMAGE_REFERENCE, value):
        return (
            f"{value!r} is not an image reference: [registry[:port]/]repository[:tag][@digest] with a "
            "lower-case repository and no spaces"
        )
    return None


def parse_quantity(value: str) -> Decimal:
    """The number a Kubernetes quantity stands for (``"400m"`` -> 0.4, ``"4Gi"`` -> 4294967296);
    ``ValueError`` when ``value`` is not a quantity."""
    text = str(value).strip()
    if not re.match(QUANTITY, text):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    number = re.match(r"^\+?[0-9.]+", text).group(0)
    suffix = text[len(number):]
    try:
        base = Decimal(number.lstrip("+"))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return base * Decimal(10) ** int(suffix[1:])
    return base * _DECIMAL[suffix]


def resource_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` is not a container resource the API server accepts, or None.

    A name is ``cpu``, ``memory``, ``ephemeral-storage``, ``hugepages-<size>`` or a fully qualified
    extended resource (``nvidia.com/gpu``), whose amount must be a whole number.
    """
    if not (name in _STANDARD_RESOURCES or name.startswith("hugepages-") or _EXTENDED.match(name)):
        return (
            f"{name!r} is not a resource name: use cpu, memory, ephemeral-storage, hugepages-<size> or a "
            "fully qualified extended resource such as nvidia.com/gpu"
        )
    try:
        amount = parse_quantity(value)
    except ValueError:
        return (
            f"{value!r} is not a Kubernetes quantity: a number with an optional suffix, binary (Ki, Mi, "
            "Gi, Ti, Pi, Ei), decimal (m, k, M, G, T, P, E) or an exponent (e3), e.g. 400m, 4Gi, 64G"
        )
    if "/" in name and amount != amount.to_integral_value():
        return f"{value!r}: an extended resource ({name}) must be a whole number"
    return None


def requests_gpu(resources: Mapping[str, str]) -> bool:
    """True when ``resources`` asks for at least one GPU (``nvidia.com/gpu``, or any ``*/gpu``)."""
    for name, value in resources.items():
        if name.endswith("/gpu"):
            try:
                if parse_quantity(value) > 0:
                    return True
            except ValueError:
                return True  # malformed, but meant as a GPU request
    return False
