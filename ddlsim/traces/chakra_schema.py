"""The Chakra execution-trace schema (MLCommons Chakra ``schema/protobuf/et_def.proto``,
package ``ChakraProtoMsg``), built at run time with protobuf's descriptor API so no ``protoc``
step is needed, and the file framing Chakra uses (each message preceded by its length as a
varint; the first message a ``GlobalMetadata``).

Only the messages ddlsim reads and writes are declared (``AttributeProto`` and its list
messages, ``GlobalMetadata``, ``IOInfo``, ``Node`` fields 1-10); fields a file carries beyond
them (``Node.storage``) are kept by protobuf as unknown fields and skipped.
"""

from __future__ import annotations

from functools import lru_cache
from typing import BinaryIO, Iterator

__all__ = ["schema", "NODE_TYPES", "COLLECTIVES", "write_delimited", "read_delimited"]

#: NodeType values (et_def.proto)
NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3,
              "COMP_NODE": 4, "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7,
              "STORAGE_NODE": 8, "BATCH_NODE": 9, "CHECKPOINT_NODE": 10}
#: CollectiveCommType values (et_def.proto)
COLLECTIVES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
               "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8,
               "BARRIER": 9}

# AttributeProto's oneof ``value``: (field name, number, scalar type, list message)
_VALUES = [("double", 3, "DOUBLE"), ("float", 5, "FLOAT"), ("int32", 7, "INT32"),
           ("int64", 9, "INT64"), ("uint32", 11, "UINT32"), ("uint64", 13, "UINT64"),
           ("sint32", 15, "SINT32"), ("sint64", 17, "SINT64"), ("fixed32", 19, "FIXED32"),
           ("fixed64", 21, "FIXED64"), ("sfixed32", 23, "SFIXED32"),
           ("sfixed64", 25, "SFIXED64"), ("bool", 27, "BOOL"), ("string", 29, "STRING"),
           ("bytes", 31, "BYTES")]


def _file():
    from google.protobuf import descriptor_pb2 as d

    F = d.FieldDescriptorProto
    f = d.FileDescriptorProto(name="ddlsim_chakra_et_def.proto", package="ChakraProtoMsg",
                              syntax="proto3")

    def message(name, fields, oneof=None):
        m = f.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, in_oneof in fields:
            fd = m.field.add(name=fname, number=number, type=getattr(F, "TYPE_" + ftype),
                             label=getattr(F, "LABEL_" + label))
            if type_name:
                fd.type_name = f".ChakraProtoMsg.{type_name}"
            if in_oneof:
                fd.oneof_index = 0
        return m

    for name, _, ftype in _VALUES:
        message(name.capitalize() + "List", [("values", 1, ftype, "REPEATED", None, False)])
    attr = [("name", 1, "STRING", "OPTIONAL", None, False),
            ("doc_string", 2, "STRING", "OPTIONAL", None, False)]
    for name, number, ftype in _VALUES:
        attr += [(f"{name}_val", number, ftype, "OPTIONAL", None, True),
                 (f"{name}_list", number + 1, "MESSAGE", "OPTIONAL",
                  name.capitalize() + "List", True)]
    message("AttributeProto", attr, oneof="value")
    message("GlobalMetadata", [("version", 1, "STRING", "OPTIONAL", None, False),
                               ("attr", 2, "MESSAGE", "REPEATED", "AttributeProto", False)])
    message("IOInfo", [(n, i, "STRING", "OPTIONAL", None, False)
                       for i, n in enumerate(("values", "shapes", "types"), 1)])
    for enum, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVES)):
        e = f.enum_type.add(name=enum)
        for k, v in values.items():
            e.value.add(name=k, number=v)
    node = message("Node", [
        ("id", 1, "UINT64", "OPTIONAL", None, False), ("name", 2, "STRING", "OPTIONAL", None, False),
        ("ctrl_deps", 4, "UINT64", "REPEATED", None, False),
        ("data_deps", 5, "UINT64", "REPEATED", None, False),
        ("start_time_micros", 6, "UINT64", "OPTIONAL", None, False),
        ("duration_micros", 7, "UINT64", "OPTIONAL", None, False),
        ("inputs", 8, "MESSAGE", "OPTIONAL", "IOInfo", False),
        ("outputs", 9, "MESSAGE", "OPTIONAL", "IOInfo", False),
        ("attr", 10, "MESSAGE", "REPEATED", "AttributeProto", False)])
    node.field.add(name="type", number=3, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                   type_name=".ChakraProtoMsg.NodeType")
    return f


@lru_cache(maxsize=None)
def schema() -> dict:
    """The message classes by name: ``Node``, ``GlobalMetadata``, ``AttributeProto``, the
    ``…List`` messages. Needs the ``protobuf`` package (``pip install 'ddlsim[traces]'``)."""
    try:
        from google.protobuf import descriptor_pool, message_factory
    except ImportError:
        from ..errors import ConfigError
        raise ConfigError("Chakra execution traces need the protobuf package: "
                          "pip install 'ddlsim[traces]'") from None
    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(_file())
    return {name: message_factory.GetMessageClass(fd.message_types_by_name[name])
            for name in fd.message_types_by_name}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def write_delimited(f: BinaryIO, message) -> None:
    """Write ``message`` preceded by its length as a varint (Chakra's ``encodeMessage``)."""
    data = message.SerializeToString(deterministic=True)
    f.write(_varint(len(data)) + data)


def read_delimited(data: bytes, source: str = "the file") -> Iterator[bytes]:
    """The length-delimited messages of ``data`` (raw bytes each)."""
    from ..errors import ConfigError
    i = 0
    while i < len(data):
        n = shift = 0
        while True:
            if i >= len(data) or shift > 63:
                raise ConfigError(f"Chakra trace {source}: truncated length prefix at byte {i}")
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if i + n > len(data):
            raise ConfigError(f"Chakra trace {source}: a message of {n} bytes at byte {i} runs "
                              f"past the end of the file ({len(data)} bytes)")
        yield data[i:i + n]
        i += n
