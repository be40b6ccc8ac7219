#!/usr/bin/env python3
"""Reference producer for tests and the demo: writes records with confluent-kafka and its
Schema Registry serializers (the reference implementation of the Confluent wire format).

Reads one JSON document on stdin:
{
  "bootstrap": "127.0.0.1:19092", "registry": "http://.../apis/ccompat/v7", "topic": "t",
  "key":   {"format": "string" | "json" | "raw" | "avro" | "protobuf" | "json_schema", ...},
  "value": {"format": ..., "schema": "...", "message": "pkg.Msg", "proto_files": {"a.proto": "..."}},
  "steps": [{"txn": null | "commit" | "abort", "records": [
      {"key": ..., "value": ..., "headers": [["name", "text" | null]], "partition": 0,
       "raw_value_b64": "..."}]}]
}
Values may use tagged JSON for types JSON lacks: {"$decimal": "1.23"}, {"$bytes": "<base64>"},
{"$datetime": "2024-01-02T03:04:05.678+00:00"}, {"$date": "2024-01-02"}.

Prints a JSON document: {"records": [{"partition": p, "offset": o}, ...] } in produce order
(offsets are known only for acknowledged records).
"""
import base64
import faulthandler
import datetime
import decimal
import json
import os
import subprocess
import sys
import tempfile

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def untag(v):
    if isinstance(v, dict):
        if len(v) == 1:
            (k, x), = v.items()
            if k == "$decimal":
                return decimal.Decimal(x)
            if k == "$bytes":
                return base64.b64decode(x)
            if k == "$datetime":
                return datetime.datetime.fromisoformat(x)
            if k == "$date":
                return datetime.date.fromisoformat(x)
        return {k: untag(x) for k, x in v.items()}
    if isinstance(v, list):
        return [untag(x) for x in v]
    return v


def compile_proto(files):
    """Compiles .proto sources with grpc_tools' protoc; returns a descriptor pool."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from grpc_tools import protoc
    import grpc_tools

    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        out = os.path.join(d, "set.pb")
        include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        rc = protoc.main(["protoc", f"-I{d}", f"-I{include}", "--include_imports",
                          f"--descriptor_set_out={out}", *files.keys()])
        if rc != 0:
            raise SystemExit(f"protoc failed with {rc}")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    pool = descriptor_pool.Default()
    for fdp in fds.file:
        try:
            pool.FindFileByName(fdp.name)
        except KeyError:
            pool.Add(fdp)
    return pool


def make_serializer(spec, sr, field):
    fmt = spec.get("format", "raw")
    conf = {"subject.name.strategy": topic_subject_name_strategy, "auto.register.schemas": True}
    if fmt == "avro":
        ser = AvroSerializer(sr, spec["schema"], conf=conf)
        return lambda v, ctx: ser(untag(v), ctx)
    if fmt == "json_schema":
        ser = JSONSerializer(spec["schema"], sr, conf=conf)
        return lambda v, ctx: ser(v, ctx)
    if fmt == "protobuf":
        from google.protobuf import json_format, message_factory
        pool = compile_proto(spec["proto_files"])
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(spec["message"]))
        ser = ProtobufSerializer(cls, sr, conf={**conf, "use.deprecated.format": False})
        return lambda v, ctx: ser(json_format.ParseDict(v, cls()), ctx)
    if fmt == "string":
        return lambda v, ctx: None if v is None else str(v).encode()
    if fmt == "json":
        return lambda v, ctx: None if v is None else json.dumps(v).encode()
    if fmt == "raw":
        return lambda v, ctx: None if v is None else base64.b64decode(v)
    raise SystemExit(f"unknown format {fmt}")


def main():
    # The tests wait 180 s for this script: print every thread's stack and exit just before,
    # so a hang shows where it is.
    faulthandler.dump_traceback_later(170, exit=True)
    spec = json.load(sys.stdin)
    topic = spec["topic"]
    sr = SchemaRegistryClient({"url": spec["registry"], "timeout": 20}) if spec.get("registry") else None
    key_ser = make_serializer(spec.get("key", {"format": "string"}), sr, MessageField.KEY)
    value_ser = make_serializer(spec.get("value", {"format": "json"}), sr, MessageField.VALUE)
    common = {"bootstrap.servers": spec["bootstrap"], "enable.idempotence": True, "acks": "all",
              "linger.ms": 5}
    common.update(spec.get("kafka", {}))
    plain = Producer(common)
    txn_producer = None
    results = []

    def report(err, msg):
        if err is not None:
            raise SystemExit(f"delivery failed: {err}")

    if "generate" in spec:
        # Bulk mode for load tests: N records over K keys, spread over the topic's partitions
        # by key, each value a JSON object padded to about value_bytes.
        g = spec["generate"]
        pad = "x" * max(0, g.get("value_bytes", 100) - 20)
        for i in range(g["count"]):
            while True:
                try:
                    plain.produce(topic, key=f"k{i % g['keys']}".encode(), value=f'{{"i":{i},"p":"{pad}"}}'.encode())
                    break
                except BufferError:
                    plain.poll(0.05)
            if i % 10000 == 0:
                plain.poll(0)
        remaining = plain.flush(120)
        if remaining:
            raise SystemExit(f"{remaining} records not delivered")
        json.dump({"records": [], "generated": g["count"]}, sys.stdout)
        return

    for step in spec["steps"]:
        txn = step.get("txn")
        p = plain
        if txn:
            if txn_producer is None:
                txn_producer = Producer({**common, "transactional.id": spec.get("transactional_id", f"ref-{topic}-{os.getpid()}")})
                txn_producer.init_transactions(30)
            p = txn_producer
            p.begin_transaction()
        slots = []
        for r in step["records"]:
            kctx = SerializationContext(topic, MessageField.KEY)
            vctx = SerializationContext(topic, MessageField.VALUE)
            key = key_ser(r.get("key"), kctx)
            if "raw_value_b64" in r:
                value = base64.b64decode(r["raw_value_b64"])
            else:
                value = value_ser(r.get("value"), vctx)
            headers = [(h[0], None if h[1] is None else (h[1].encode() if isinstance(h[1], str) else untag(h[1]))) for h in r.get("headers", [])]
            slot = {}
            slots.append(slot)

            def cb(err, msg, slot=slot):
                if err is not None:
                    slot["error"] = str(err)
                else:
                    slot["partition"] = msg.partition()
                    slot["offset"] = msg.offset()

            kwargs = {"key": key, "value": value, "headers": headers or None, "on_delivery": cb}
            if "partition" in r:
                kwargs["partition"] = r["partition"]
            if "timestamp_ms" in r:
                kwargs["timestamp"] = r["timestamp_ms"]
            while True:
                try:
                    p.produce(topic, **kwargs)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
        if txn == "commit":
            p.commit_transaction(30)
        elif txn == "abort":
            p.flush(30)
            p.abort_transaction(30)
        else:
            p.flush(30)
        for s in slots:
            if "error" in s and txn != "abort":
                raise SystemExit(f"delivery failed: {s['error']}")
        results.extend({"txn": txn, **s} for s in slots)
    plain.flush(30)
    json.dump({"records": results}, sys.stdout)


if __name__ == "__main__":
    main()
