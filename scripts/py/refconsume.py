#!/usr/bin/env python3
"""Reference consumer for tests: reads a topic with confluent-kafka and its Schema Registry
deserializers (the reference implementation of the Confluent wire format).

Reads one JSON document on stdin:
{
  "bootstrap": "127.0.0.1:19092", "registry": "http://.../apis/ccompat/v7", "topic": "t",
  "isolation": "read_committed" | "read_uncommitted", "timeout_s": 30,
  "expect": 10,               # stop after this many records (or when every partition is at its end)
  "key":   {"format": "string" | "json" | "raw"},
  "value": {"format": "avro" | "protobuf" | "json_schema" | "json" | "string" | "raw",
            "message": "pkg.Msg", "proto_files": {"a.proto": "..."}}
}

Prints {"records": [{"partition": p, "offset": o, "key": ..., "value": ..., "headers": [[k, v]]}]}
ordered by partition, then offset. Avro decimals, bytes and datetimes are written as strings
(bytes in base64); Protobuf messages in the proto3 JSON mapping with proto field names.
"""
import base64
import faulthandler
import datetime
import decimal
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

sys.path.insert(0, __import__("os").path.dirname(__file__))
from refproduce import compile_proto  # noqa: E402


def plain(v):
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    return v


def make_deserializer(side, registry):
    fmt = side.get("format", "raw")
    if fmt == "avro":
        d = AvroDeserializer(registry)
        return lambda b, ctx: plain(d(b, ctx))
    if fmt == "json_schema":
        d = JSONDeserializer(None, schema_registry_client=registry)
        return lambda b, ctx: plain(d(b, ctx))
    if fmt == "protobuf":
        from google.protobuf import json_format
        from google.protobuf.message_factory import GetMessageClass

        pool = compile_proto(side["proto_files"])
        cls = GetMessageClass(pool.FindMessageTypeByName(side["message"]))
        d = ProtobufDeserializer(cls, {"use.deprecated.format": False})
        return lambda b, ctx: json_format.MessageToDict(
            d(b, ctx), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    if fmt == "json":
        return lambda b, ctx: None if b is None else json.loads(b)
    if fmt == "string":
        return lambda b, ctx: None if b is None else b.decode()
    return lambda b, ctx: None if b is None else base64.b64encode(b).decode()


def main():
    # The tests wait 180 s for this script: print every thread's stack and exit just before,
    # so a hang shows where it is.
    faulthandler.dump_traceback_later(170, exit=True)
    spec = json.load(sys.stdin)
    registry = SchemaRegistryClient({"url": spec["registry"], "timeout": 20}) if spec.get("registry") else None
    key_de = make_deserializer(spec.get("key", {"format": "string"}), registry)
    value_de = make_deserializer(spec.get("value", {"format": "raw"}), registry)
    topic = spec["topic"]
    consumer = Consumer({
        "bootstrap.servers": spec["bootstrap"],
        "group.id": f"refconsume-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "isolation.level": spec.get("isolation", "read_committed"),
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    })
    md = consumer.list_topics(topic, timeout=30)
    partitions = sorted(md.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    expect = spec.get("expect")
    deadline = time.monotonic() + spec.get("timeout_s", 60)
    at_end = set()
    records = []
    while time.monotonic() < deadline:
        if expect is not None and len(records) >= expect:
            break
        if expect is None and len(at_end) == len(partitions):
            break
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
                continue
            raise SystemExit(f"consume error: {msg.error()}")
        at_end.discard(msg.partition())
        key_ctx = SerializationContext(topic, MessageField.KEY, msg.headers())
        value_ctx = SerializationContext(topic, MessageField.VALUE, msg.headers())
        headers = [[k, None if v is None else v.decode()] for k, v in (msg.headers() or [])]
        records.append({
            "partition": msg.partition(),
            "offset": msg.offset(),
            "key": key_de(msg.key(), key_ctx),
            "value": value_de(msg.value(), value_ctx),
            "headers": headers,
        })
    consumer.close()
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    json.dump({"records": records}, sys.stdout)


if __name__ == "__main__":
    main()
