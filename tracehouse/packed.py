"""Numeric columns appended to a message's packed repeated fields from numpy arrays: the field's
bytes are made by numpy and parsed by protobuf's C runtime, where `extend(array.tolist())` makes a
Python object of every value (1 µs an event instead of 0.1). The message then serializes to the
same bytes as one filled value by value."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_FIXED = {  # fields of eight bytes a value: their little-endian dtype
    FieldDescriptor.TYPE_SFIXED64: "<i8",
    FieldDescriptor.TYPE_FIXED64: "<u8",
    FieldDescriptor.TYPE_DOUBLE: "<f8",
}
_VARINT_RANGE = {  # varint fields: the values they hold
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def extend(message: Message, field: str, values: npt.ArrayLike) -> None:
    """Append `values` to the packed repeated numeric field `field` of `message`, as
    `getattr(message, field).extend(values)` would, refusing values the field cannot hold."""
    descriptor = message.DESCRIPTOR.fields_by_name[field]
    array = np.ravel(values)
    if not array.size:
        message.MergeFromString(b"")  # present, as after extend([])
        return
    if descriptor.type in _FIXED:
        payload = _fixed(array, field, _FIXED[descriptor.type])
    elif descriptor.type in _VARINT_RANGE:
        payload = _varints(_unsigned(array, field, descriptor.type))
    else:
        raise TypeError(f"{field}: {descriptor.type} is not a packed numeric field this encoder writes")
    message.MergeFromString(length_delimited(descriptor.number, payload))


def length_delimited(number: int, body: bytes) -> bytes:
    """Field `number` holding `body` (a packed field's values, or a message's bytes), as protobuf
    writes it: its key (wire type 2), its length, then `body`."""
    return _varints(np.array([number << 3 | 2, len(body)], np.uint64)) + body


def _fixed(array: npt.NDArray[Any], field: str, dtype: str) -> bytes:
    if dtype == "<f8":
        if array.dtype.kind not in "fiub":
            raise TypeError(f"{field}: {array.dtype} values for a double field")
        return np.ascontiguousarray(array, dtype=dtype).tobytes()
    if array.dtype.kind not in "iub":
        raise TypeError(f"{field}: {array.dtype} values for an integer field")
    low, high = (-(2**63), 2**63 - 1) if dtype == "<i8" else (0, 2**64 - 1)
    _check_range(array, field, low, high)
    return np.ascontiguousarray(array.astype(dtype, copy=False)).tobytes()


def _unsigned(array: npt.NDArray[Any], field: str, kind: int) -> npt.NDArray[np.uint64]:
    """The varints' values: zigzag for sint32, the values themselves for unsigned fields."""
    if array.dtype.kind not in "iub":
        raise TypeError(f"{field}: {array.dtype} values for an integer field")
    low, high = _VARINT_RANGE[kind]
    _check_range(array, field, low, high)
    if kind == FieldDescriptor.TYPE_SINT32:
        signed = array.astype(np.int64)
        return ((signed << 1) ^ (signed >> 63)).astype(np.uint64)
    return array.astype(np.uint64)


def _check_range(array: npt.NDArray[Any], field: str, low: int, high: int) -> None:
    if array.dtype.kind == "b":
        return
    info = np.iinfo(array.dtype)
    if info.min >= low and info.max <= high:
        return
    smallest, largest = int(array.min()), int(array.max())
    if smallest < low or largest > high:
        bad = smallest if smallest < low else largest
        raise ValueError(f"{field}: value {bad} is out of range for the field ({low}..{high})")


def _varints(values: npt.NDArray[np.uint64]) -> bytes:
    """Base-128 varints, seven bits a byte, least significant first, the high bit set on every
    byte but a value's last: a row of bytes per value, of which those the value needs are kept
    (`keep`, made a column at a time: numpy broadcasts a column of sizes against a row of byte
    numbers several times slower)."""
    largest = int(values.max())
    if largest < 0x80:
        return values.astype(np.uint8).tobytes()
    kind = np.dtype(np.uint32 if largest < 2**32 else np.uint64)
    narrow: npt.NDArray[Any] = values.astype(kind)
    width = (largest.bit_length() + 6) // 7
    rows = np.empty((values.size, width), np.uint8)
    keep = np.ones((values.size, width), bool)
    for byte in range(width):
        low = (narrow >> kind.type(7 * byte)).astype(np.uint8) & np.uint8(0x7F)
        if byte + 1 < width:
            more = narrow >= kind.type(1 << 7 * (byte + 1))
            keep[:, byte + 1] = more
            low |= more.view(np.uint8) << np.uint8(7)
        rows[:, byte] = low
    if keep[:, -1].all():
        return rows.tobytes()
    return np.compress(keep.ravel(), rows.ravel()).tobytes()
