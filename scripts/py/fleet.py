#!/usr/bin/env python3
"""`scripts/bench --fleet N`: the cost of N mostly idle connections in one daemon (issue 28).

  fleet.py --binary PATH --connections N --out FILE.json [--records R] [--idle-seconds S]

One release daemon with N connections, each its own consumer group with one trigger on its own
2-partition topic holding R records (JSON values, default 200), against the dev dispatcher
(`tessel-kafka dev-dispatcher --bench`, answering 202 at once). Figures, all from /proc and the
daemon's own /health:

  assigned   seconds from the daemon's start until /health reports every partition assigned
  drained    seconds from the start until the dispatcher accepted every record
  peak RSS   VmHWM of the daemon once idle
  threads    Threads of the daemon once idle (and by name: rdk:*, kafka-*, tokio-*)
  idle CPU   utime+stime of the daemon over S seconds (default 15) starting 2 s after the
             drain, in cores; per thread name, the scheduler's CPU time and the
             voluntary+involuntary context switches per second over the same window (what
             wakes). FLEET_KAFKA="k=v,..." adds librdkafka properties to every connection,
             FLEET_CONCURRENCY sets each trigger's concurrency (8), FLEET_LATENCY_MS how
             long the dispatcher holds each request (0).
  stop       seconds from SIGTERM until the daemon exited (and its exit status)
  fds        open descriptors of the daemon at their peak while draining (sampled every
             0.2 s from /proc/PID/fd) and once idle, its soft limit, and the dispatch
             attempts that failed for lack of them (tessel_kafka_fds_exhausted_total) and
             for any reason (tessel_kafka_dispatch_attempts_total not accepted)

  fleet.py ... --replicas R [--region]

R daemons on the same connections (each its own admin port): without --region every one
runs every connection (each connection's group has R members); with --region they form one
region (a [region] section with [region.kafka] on the local broker, its own name per run) and
divide the connections among themselves (spread 2). Figures are given per replica, plus the
librdkafka clients each runs (tessel_kafka_region_clients).

A benchmark, not a test: it fails only when the daemon does not start, does not drain, or does
not exit.
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict

CLK_TCK = os.sysconf("SC_CLK_TCK")
PARTITIONS = 2


def log(msg):
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(host, port, path, timeout=5):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return json.loads(r.read())
    finally:
        c.close()


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def thread_group(comm):
    """Threads grouped by name: librdkafka's by kind, ours by role, the connection name dropped."""
    if comm.startswith("rdk:broker"):
        return "rdk:broker-1 (internal/coordinator)" if comm.startswith("rdk:broker-1") else "rdk:broker<id>"
    for prefix in ("kafka-poll", "kafka-commit", "kafka-flow", "kafka-ops", "tokio-runtime"):
        if comm.startswith(prefix):
            return prefix
    return re.sub(r"\d+$", "", comm)


def threads_snapshot(pid):
    """{tid: (group, CPU nanoseconds, context switches)} of every thread of pid. The CPU time is
    the scheduler's (schedstat, in ns): a thread's utime+stime in /proc/PID/task/TID/stat is
    sampled at the clock tick, and a thread that runs for microseconds at a time (librdkafka's
    broker threads of an idle client) was shown there as 0.00 cores while it took 0.2."""
    snap = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            switches = 0
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split(":")[1])
            snap[tid] = (thread_group(comm), ns, switches)
        except OSError:
            continue
    return snap


def create_topics(topics):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": os.environ["TESSEL_IT_BOOTSTRAP"], "log_level": 3})
    for i in range(0, len(topics), 200):
        chunk = topics[i:i + 200]
        futures = admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in chunk], operation_timeout=60)
        for f in futures.values():
            f.result(120)


def produce(topics, records):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": os.environ["TESSEL_IT_BOOTSTRAP"], "linger.ms": 20,
                  "log_level": 3})
    failed = []
    for topic in topics:
        for i in range(records):
            while True:
                try:
                    p.produce(topic, key=f"k{i % 20}", value=json.dumps({"n": i, "topic": topic}),
                              on_delivery=lambda err, _m: err and failed.append(err))
                    break
                except BufferError:
                    p.poll(0.1)
        p.poll(0)
    if p.flush(120) or failed:
        raise Failure(f"producing failed: {failed[:3]}")


def write_config(path, n, topics, groups, dispatcher_url, admin_port, region=None, replica=None):
    lines = [f"# scripts/bench --fleet {n}", "[server]", f'listen = "127.0.0.1:{admin_port}"', ""]
    if region:
        lines += [
            "[region]",
            f'name = "{region}"',
            f'replica_id = "{replica}"',
            "[region.kafka]",
            f'"bootstrap.servers" = "{os.environ["TESSEL_IT_BOOTSTRAP"]}"',
            "",
        ]
    for i in range(n):
        c = f"c{i:04d}"
        lines += [
            f"[connections.{c}]",
            "drain_timeout_ms = 10000",
            f"[connections.{c}.kafka]",
            f'"bootstrap.servers" = "{os.environ["TESSEL_IT_BOOTSTRAP"]}"',
            f'"group.id" = "{groups[i]}"',
            '"auto.offset.reset" = "earliest"',
            *(f'"{k}" = "{v}"' for k, v in extra_kafka()),
            f"[connections.{c}.triggers.t]",
            f'topics = ["{topics[i]}"]',
            'workflow = "fleet"',
            f'concurrency = {os.environ.get("FLEET_CONCURRENCY", "8")}',
            'key_format = "string"',
            'value_format = "json"',
            f'dispatcher = {{ url = "{dispatcher_url}", timeout_ms = 10000 }}',
            "",
        ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def extra_kafka():
    """FLEET_KAFKA="key=value,key=value": librdkafka properties added to every connection, to
    compare settings in the same run (e.g. statistics.interval.ms=2000)."""
    pairs = [p for p in os.environ.get("FLEET_KAFKA", "").split(",") if p]
    return [tuple(p.split("=", 1)) for p in pairs]


def metric(host, port, name, want=None):
    """The sum of the samples of `name` on /metrics (None when it has none); with `want`, only
    the samples whose labels contain it."""
    c = http.client.HTTPConnection(host, port, timeout=5)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    finally:
        c.close()
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if want is not None and want(line):
                continue
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def run(args):
    n, records, replicas = args.connections, args.records, args.replicas
    stamp = f"{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
    topics = [f"fleet-{stamp}-{i}" for i in range(n)]
    groups = [f"fleet-{stamp}-g{i}" for i in range(n)]
    region = f"fleet-{stamp}" if args.region else None
    os.makedirs(args.workdir, exist_ok=True)
    log(f"{n} topics of {PARTITIONS} partitions, {records} records each; {replicas} replica(s)"
        + (f", region {region}" if region else ", every replica runs every connection"))
    create_topics(topics)
    produce(topics, records)

    dlog = open(os.path.join(args.workdir, f"fleet-{stamp}-dispatcher.log"), "w")
    disp = subprocess.Popen([args.binary, "dev-dispatcher", "--bench", "--listen", "127.0.0.1:0",
                             "--latency-ms", os.environ.get("FLEET_LATENCY_MS", "0")],
                            stdout=subprocess.PIPE, stderr=dlog, text=True,
                            env={**os.environ, "RUST_LOG": "warn"})
    daemons = []
    try:
        line = disp.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)(/\S*)", line)
        if not m:
            raise Failure(f"dispatcher did not start: {line!r}")
        dhost, dport = m.group(1), int(m.group(2))
        url = f"http://{dhost}:{dport}{m.group(3)}"
        env = {k: v for k, v in os.environ.items() if k != "RUST_LOG" and not k.startswith("TESSEL_KAFKA__")}
        t0 = time.monotonic()
        for r in range(replicas):
            port = free_port()
            config = os.path.join(args.workdir, f"fleet-{stamp}-{r}.toml")
            write_config(config, n, topics, groups, url, port, region, f"fleet-{r}")
            dmn_log = os.path.join(args.workdir, f"fleet-{stamp}-{r}-daemon.log")
            log(f"starting daemon {r} (log {dmn_log})")
            proc = subprocess.Popen([args.binary, "run", "--config", config], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=open(dmn_log, "w"), env=env)
            daemons.append({"proc": proc, "port": port, "log": dmn_log, "peak_fds": 0})
        want_partitions, want_runs = n * PARTITIONS, n * records
        assigned_s = drained_s = None
        deadline = t0 + args.timeout
        while assigned_s is None or drained_s is None:
            for d in daemons:
                if d["proc"].poll() is not None:
                    raise Failure(f"a daemon exited ({d['proc'].returncode}); log {d['log']}")
                d["peak_fds"] = max(d["peak_fds"], open_fds(d["proc"].pid))
            if time.monotonic() > deadline:
                raise Failure(f"not assigned and drained within {args.timeout} s "
                              f"(assigned {assigned_s}, drained {drained_s}); logs {args.workdir}")
            now = time.monotonic() - t0
            if assigned_s is None:
                try:
                    got = 0
                    for d in daemons:
                        h = get_json("127.0.0.1", d["port"], "/health")
                        got += sum(c.get("assigned_partitions", 0) for c in h.get("connections", {}).values())
                    if got >= want_partitions:
                        assigned_s = now
                        log(f"every partition assigned after {now:.2f} s")
                except (OSError, ValueError, http.client.HTTPException):
                    pass
            if drained_s is None:
                runs = get_json(dhost, dport, "/stats").get("runs", 0)
                if runs >= want_runs:
                    drained_s = now
                    log(f"{runs} records dispatched after {now:.2f} s")
            time.sleep(0.2)

        time.sleep(2)
        before = []
        for d in daemons:
            pid = d["proc"].pid
            before.append((threads_snapshot(pid), cpu_ticks(pid)))
        w0 = time.monotonic()
        log(f"idle for {args.idle_seconds} s")
        time.sleep(args.idle_seconds)
        wall = time.monotonic() - w0
        per_replica = []
        for d, (th0, c0) in zip(daemons, before):
            pid = d["proc"].pid
            th1, c1 = threads_snapshot(pid), cpu_ticks(pid)
            idle_cores = (c1 - c0) / CLK_TCK / wall
            status = proc_status(pid)
            by_group = defaultdict(lambda: {"threads": 0, "cores": 0.0, "wakes_per_s": 0.0})
            for tid, (group, ns, switches) in th1.items():
                g = by_group[group]
                g["threads"] += 1
                if tid in th0:
                    g["cores"] += (ns - th0[tid][1]) / 1e9 / wall
                    g["wakes_per_s"] += (switches - th0[tid][2]) / wall
            # Threads that started or ended within the window (tokio's blocking pool keeps an
            # idle thread 100 ms): the process's total minus what the threads alive throughout
            # took.
            rest = idle_cores - sum(g["cores"] for g in by_group.values())
            by_group["(threads started or ended in the window)"]["cores"] = max(rest, 0.0)
            for g in by_group.values():
                g["cores"] = round(g["cores"], 4)
                g["wakes_per_s"] = round(g["wakes_per_s"], 1)
            port = d["port"]
            per_replica.append({
                "connections": int(metric("127.0.0.1", port, "tessel_kafka_region_connections_placed") or 0),
                "clients": int(metric("127.0.0.1", port, "tessel_kafka_region_clients") or 0),
                "peak_rss_mib": round(int(status["VmHWM"].split()[0]) / 1024, 1),
                "rss_idle_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
                "threads": int(status["Threads"]),
                "idle_cores": round(idle_cores, 4),
                "idle_wakes_per_s": round(sum(g["wakes_per_s"] for g in by_group.values()), 1),
                "peak_fds": d["peak_fds"],
                "idle_fds": open_fds(pid),
                "fds_limit": int(metric("127.0.0.1", port, "tessel_kafka_open_fds_limit") or 0),
                "fds_exhausted": int(metric("127.0.0.1", port, "tessel_kafka_fds_exhausted_total") or 0),
                "failed_attempts": int(metric("127.0.0.1", port, "tessel_kafka_dispatch_attempts_total",
                                              want=lambda l: 'outcome="accepted"' in l) or 0),
                "by_thread": dict(sorted(by_group.items(), key=lambda kv: -kv[1]["wakes_per_s"])),
            })
        runs_after = get_json(dhost, dport, "/stats")

        stops = []
        for d in daemons:
            t_stop = time.monotonic()
            d["proc"].send_signal(signal.SIGTERM)
            try:
                code = d["proc"].wait(args.timeout)
            except subprocess.TimeoutExpired:
                raise Failure(f"a daemon did not exit within {args.timeout} s of SIGTERM")
            stops.append((round(time.monotonic() - t_stop, 2), code))
        for p, (stop_s, code) in zip(per_replica, stops):
            p["stop_s"], p["exit_status"] = stop_s, code
        first = per_replica[0]
        return {
            "connections": n,
            "replicas": replicas,
            "region": bool(region),
            "records_per_topic": records,
            "assigned_s": round(assigned_s, 2),
            "drained_s": round(drained_s, 2),
            # The first replica's figures at the top level, as a single daemon's were.
            **{k: first[k] for k in ("peak_rss_mib", "rss_idle_mib", "threads", "idle_cores",
                                     "idle_wakes_per_s", "by_thread", "stop_s", "exit_status",
                                     "peak_fds", "idle_fds", "fds_limit", "fds_exhausted",
                                     "failed_attempts", "clients")},
            "idle_seconds": round(wall, 1),
            "duplicates": runs_after.get("duplicates"),
            "per_replica": per_replica,
        }
    finally:
        for d in daemons:
            if d["proc"].poll() is None:
                d["proc"].kill()
                d["proc"].wait()
        disp.send_signal(signal.SIGTERM)
        try:
            disp.wait(10)
        except subprocess.TimeoutExpired:
            disp.kill()
        dlog.close()
        delete_topics(topics)


def delete_topics(topics):
    try:
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": os.environ["TESSEL_IT_BOOTSTRAP"], "log_level": 3})
        for i in range(0, len(topics), 200):
            for f in admin.delete_topics(topics[i:i + 200], operation_timeout=60).values():
                f.result(120)
    except Exception as e:  # noqa: BLE001 (clean-up only)
        log(f"could not delete the fleet's topics: {e}")


def table(results):
    head = ["connections", "replicas", "peak RSS", "threads", "CPU while idle", "wakes/s idle",
            "all assigned", "drained", "peak fds", "fd failures", "stop (SIGTERM)"]
    rows = [[str(r["connections"]), str(r["replicas"]) + (" (region)" if r["region"] else ""),
             f'{r["peak_rss_mib"]} MiB', str(r["threads"]),
             f'{r["idle_cores"]:.3f} cores', f'{r["idle_wakes_per_s"]:.0f}', f'{r["assigned_s"]:.1f} s',
             f'{r["drained_s"]:.1f} s', f'{r["peak_fds"]} of {r["fds_limit"]}',
             f'{r["fds_exhausted"]} ({r["failed_attempts"]} failed attempts)',
             f'{r["stop_s"]:.1f} s (exit {r["exit_status"]})'] for r in results]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def replica_table(results):
    """Per replica: what every-replica-runs-all costs against the region's placement."""
    head = ["case", "replica", "connections", "librdkafka clients", "threads", "RSS idle (peak)",
            "CPU while idle", "fds idle (peak)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        case = f'{r["connections"]} conn., {r["replicas"]} replicas, ' + (
            "region (spread 2)" if r["region"] else "every replica runs all")
        for i, p in enumerate(r["per_replica"]):
            out.append("| " + " | ".join([
                case, str(i), str(p["connections"]), str(p["clients"]), str(p["threads"]),
                f'{p["rss_idle_mib"]} MiB ({p["peak_rss_mib"]})', f'{p["idle_cores"]:.3f} cores',
                f'{p["idle_fds"]} ({p["peak_fds"]})']) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--connections", required=True, type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--records", type=int, default=int(os.environ.get("FLEET_RECORDS", "200")))
    ap.add_argument("--idle-seconds", type=float, default=float(os.environ.get("FLEET_IDLE_SECONDS", "15")))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--region", action="store_true",
                    help="the replicas form a region (also runs the case without, first)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--git", default="unknown")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    results = []
    counts = args.connections
    # With --region, each count runs twice: every replica runs all (before), then the region.
    cases = [False, True] if args.region else [False]
    try:
        for n in counts:
            for region in cases:
                args.connections, args.region = n, region
                r = run(args)
                log(json.dumps(r))
                results.append(r)
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    with open(args.out, "w") as f:
        json.dump({"git": args.git, "binary": args.binary, "results": results}, f, indent=2)
    print(table(results))
    if any(r["replicas"] > 1 for r in results):
        print()
        print(replica_table(results))
    for r in results:
        print(f"\n{r['connections']} connections, idle, by thread: threads / cores / wakes per s")
        for name, g in r["by_thread"].items():
            print(f"  {name:40} {g['threads']:6} {g['cores']:8.4f} {g['wakes_per_s']:10.1f}")
    log(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
