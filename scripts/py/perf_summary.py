#!/usr/bin/env python3
"""Summarises a `perf record -g` profile of the connector (scripts/bench --perf) in two views:

  by activity   each sample goes to the innermost frame that names a part of the connector or
                of its libraries (Avro decode, event rendering, metrics, tracing, reqwest, hyper's
                connection task, supervisor, worker, offsets, librdkafka, tokio), so a malloc
                called while rendering counts as rendering
  by leaf       what the CPU was executing: allocator, memmove, kernel, hashing, serde_json...

  perf_summary.py PERF.DATA [--top N]

The patterns below follow the names in the code at the time of writing; a sample matching none
shows under "other" with its leaf symbol in the top list.
"""
import collections
import re
import subprocess
import sys

ACTIVITY = [  # innermost match wins
    ("avro decode", r"tessel_kafka::codec::avro"),
    ("decode: timestamps", r"tessel_kafka::codec::time"),
    ("decode: other (framing, registry cache)", r"tessel_kafka::codec::"),
    ("event render (JSON body)", r"tessel_kafka::event::|serde_json::ser"),
    ("metrics", r"tessel_kafka::telemetry::metrics|metrics_exporter_prometheus|metrics_util|metrics::"),
    ("tracing (spans)", r"tessel_kafka::telemetry::trace|tracing_subscriber|tracing::|tracing_core|tracing_opentelemetry|opentelemetry"),
    ("reqwest: request build and send (url, headers, pool)", r"reqwest::|url::|idna::|hyper_util::client"),
    ("hyper: HTTP/1 connection task (socket I/O, parse)", r"hyper::"),
    ("offsets and commits", r"tessel_kafka::core::offsets|tessel_kafka::core::committer|rd_kafka_commit|store_offsets"),
    ("supervisor loop", r"tessel_kafka::consumer::supervisor|tessel_kafka::core::"),
    ("worker (dispatch loop)", r"tessel_kafka::run::|tessel_kafka::dispatch"),
    ("consumer poll thread (rust side)", r"tessel_kafka::consumer::poll_loop|rdkafka::consumer"),
    ("librdkafka", r"^rd_kafka|^rd_|librdkafka"),
    ("tokio runtime (scheduler, timers, park)", r"tokio::"),
]
LEAF = [
    ("allocator (malloc, free, realloc)", r"malloc|_int_free|cfree|realloc|calloc|unlink_chunk|__rust_(alloc|dealloc|realloc)|alloc::alloc"),
    ("memmove / memcpy / memcmp", r"memmove|memcpy|memcmp|memset"),
    ("hashing (SipHash, hash_one)", r"sip::Hasher|hash_one|rapidhash"),
    ("serde_json", r"serde_json"),
    ("formatting (core::fmt)", r"core::fmt|alloc::fmt"),
    ("clock_gettime", r"clock_gettime"),
]


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    data = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,ip,sym,dso", "--no-inline"],
                         capture_output=True, text=True, check=True).stdout
    activity = [(n, re.compile(p)) for n, p in ACTIVITY]
    leaf_kinds = [(n, re.compile(p)) for n, p in LEAF]
    by_activity, by_leaf, by_comm, leaves, syscalls = (collections.Counter() for _ in range(5))
    activity_leaf = collections.defaultdict(collections.Counter)
    total = 0
    for block in out.split("\n\n"):
        lines = [l.strip() for l in block.strip().splitlines()]
        if len(lines) < 2:
            continue
        comm = lines[0].rsplit(None, 1)[0]
        frames = []
        for l in lines[1:]:
            parts = l.split(None, 1)
            if len(parts) == 2:
                sym = parts[1]
                sym = re.sub(r"\s*\(\S*\)$", "", sym)  # the (dso) suffix
                frames.append((sym, parts[1]))
        if not frames:
            continue
        total += 1
        by_comm[comm] += 1
        leaf, leaf_raw = frames[0]
        leaves[leaf] += 1
        kind = "kernel" if "kernel.kallsyms" in leaf_raw else None
        if not kind:
            kind = next((n for n, rx in leaf_kinds if rx.search(leaf)), "other code")
        by_leaf[kind] += 1
        where = next((n for sym, _ in frames for n, rx in activity if rx.search(sym)), None)
        if where is None:
            where = "librdkafka" if comm.startswith("rdk:") else f"other ({comm})"
        by_activity[where] += 1
        activity_leaf[where][kind] += 1
        if kind == "kernel":
            sys_frame = next((m.group(1) for sym, _ in frames
                              for m in [re.search(r"__(?:x64|do)_sys_(\w+)", sym)] if m), None)
            syscalls[sys_frame or "(interrupts, scheduler: no syscall frame)"] += 1

    def show(title, counter, n=None):
        print(f"\n{title} ({total} samples)")
        for k, v in counter.most_common(n):
            print(f"  {100.0 * v / total:5.1f}%  {k}")

    show("by thread", by_comm)
    show("by activity (innermost component on the stack)", by_activity)
    print("\n  the leaves of each activity:")
    for where, _ in by_activity.most_common(8):
        mix = ", ".join(f"{k} {100.0 * v / total:.1f}%" for k, v in activity_leaf[where].most_common(4))
        print(f"    {where}: {mix}")
    show("by leaf (what the CPU executed)", by_leaf)
    show("kernel time by system call", syscalls, 10)
    show(f"top {top} leaf symbols", leaves, top)


if __name__ == "__main__":
    main()
