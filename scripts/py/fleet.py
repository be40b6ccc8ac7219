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
             wakes). FLEET_KAFKA="k=v,..." adds librdkafka properties to every connection.
  stop       seconds from SIGTERM until the daemon exited (and its exit status)

A benchmark, not a test: it fails only when the daemon does not start, does not drain, or does
not exit.
"""
import argparse
import http.client
import json
import os
import re
import resource
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


def write_config(path, n, topics, groups, dispatcher_url, admin_port):
    lines = [f"# scripts/bench --fleet {n}", "[server]", f'listen = "127.0.0.1:{admin_port}"', ""]
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
            "concurrency = 8",
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


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def run(args):
    n, records = args.connections, args.records
    stamp = f"{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
    topics = [f"fleet-{stamp}-{i}" for i in range(n)]
    groups = [f"fleet-{stamp}-g{i}" for i in range(n)]
    os.makedirs(args.workdir, exist_ok=True)
    log(f"{n} topics of {PARTITIONS} partitions, {records} records each")
    create_topics(topics)
    produce(topics, records)

    dlog = open(os.path.join(args.workdir, f"fleet-{stamp}-dispatcher.log"), "w")
    disp = subprocess.Popen([args.binary, "dev-dispatcher", "--bench", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=dlog, text=True,
                            env={**os.environ, "RUST_LOG": "warn"})
    daemon = None
    try:
        line = disp.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)(/\S*)", line)
        if not m:
            raise Failure(f"dispatcher did not start: {line!r}")
        dhost, dport = m.group(1), int(m.group(2))
        url = f"http://{dhost}:{dport}{m.group(3)}"
        admin_port = free_port()
        config = os.path.join(args.workdir, f"fleet-{stamp}.toml")
        write_config(config, n, topics, groups, url, admin_port)
        env = {k: v for k, v in os.environ.items() if k != "RUST_LOG" and not k.startswith("TESSEL_KAFKA__")}
        dmn_log = os.path.join(args.workdir, f"fleet-{stamp}-daemon.log")
        log(f"starting the daemon (log {dmn_log})")
        t0 = time.monotonic()
        daemon = subprocess.Popen([args.binary, "run", "--config", config], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=open(dmn_log, "w"), env=env,
                                  preexec_fn=raise_nofile)
        want_partitions, want_runs = n * PARTITIONS, n * records
        assigned_s = drained_s = None
        deadline = t0 + args.timeout
        while assigned_s is None or drained_s is None:
            if daemon.poll() is not None:
                raise Failure(f"the daemon exited ({daemon.returncode}); log {dmn_log}")
            if time.monotonic() > deadline:
                raise Failure(f"not assigned and drained within {args.timeout} s "
                              f"(assigned {assigned_s}, drained {drained_s}); log {dmn_log}")
            now = time.monotonic() - t0
            if assigned_s is None:
                try:
                    h = get_json("127.0.0.1", admin_port, "/health")
                    got = sum(c.get("assigned_partitions", 0) for c in h.get("connections", {}).values())
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
        pid = daemon.pid
        th0, c0, w0 = threads_snapshot(pid), cpu_ticks(pid), time.monotonic()
        log(f"idle for {args.idle_seconds} s")
        time.sleep(args.idle_seconds)
        th1, c1, w1 = threads_snapshot(pid), cpu_ticks(pid), time.monotonic()
        wall = w1 - w0
        idle_cores = (c1 - c0) / CLK_TCK / wall
        status = proc_status(pid)
        by_group = defaultdict(lambda: {"threads": 0, "cores": 0.0, "wakes_per_s": 0.0})
        for tid, (group, ns, switches) in th1.items():
            g = by_group[group]
            g["threads"] += 1
            if tid in th0:
                g["cores"] += (ns - th0[tid][1]) / 1e9 / wall
                g["wakes_per_s"] += (switches - th0[tid][2]) / wall
        # Threads that started or ended within the window (tokio's blocking pool keeps an idle
        # thread 100 ms): the process's total minus what the threads alive throughout took.
        rest = idle_cores - sum(g["cores"] for g in by_group.values())
        by_group["(threads started or ended in the window)"]["cores"] = max(rest, 0.0)
        for g in by_group.values():
            g["cores"] = round(g["cores"], 4)
            g["wakes_per_s"] = round(g["wakes_per_s"], 1)
        runs_after = get_json(dhost, dport, "/stats")

        t_stop = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(args.timeout)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
            raise Failure(f"the daemon did not exit within {args.timeout} s of SIGTERM")
        stop_s = time.monotonic() - t_stop
        return {
            "connections": n,
            "records_per_topic": records,
            "assigned_s": round(assigned_s, 2),
            "drained_s": round(drained_s, 2),
            "peak_rss_mib": round(int(status["VmHWM"].split()[0]) / 1024, 1),
            "rss_idle_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            "threads": int(status["Threads"]),
            "idle_seconds": round(wall, 1),
            "idle_cores": round(idle_cores, 4),
            "idle_wakes_per_s": round(sum(g["wakes_per_s"] for g in by_group.values()), 1),
            "by_thread": dict(sorted(by_group.items(), key=lambda kv: -kv[1]["wakes_per_s"])),
            "duplicates": runs_after.get("duplicates"),
            "stop_s": round(stop_s, 2),
            "exit_status": code,
        }
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
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
    head = ["connections", "peak RSS", "threads", "CPU while idle", "wakes/s idle", "all assigned",
            "drained", "stop (SIGTERM)"]
    rows = [[str(r["connections"]), f'{r["peak_rss_mib"]} MiB', str(r["threads"]),
             f'{r["idle_cores"]:.3f} cores', f'{r["idle_wakes_per_s"]:.0f}', f'{r["assigned_s"]:.1f} s',
             f'{r["drained_s"]:.1f} s', f'{r["stop_s"]:.1f} s (exit {r["exit_status"]})'] for r in results]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--connections", required=True, type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--records", type=int, default=int(os.environ.get("FLEET_RECORDS", "200")))
    ap.add_argument("--idle-seconds", type=float, default=float(os.environ.get("FLEET_IDLE_SECONDS", "15")))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", required=True)
    ap.add_argument("--git", default="unknown")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    results = []
    counts = args.connections
    try:
        for n in counts:
            args.connections = n
            r = run(args)
            log(json.dumps(r))
            results.append(r)
    except Failure as e:
        log(f"FAILED: {e}")
        return 1
    with open(args.out, "w") as f:
        json.dump({"git": args.git, "binary": args.binary, "results": results}, f, indent=2)
    print(table(results))
    for r in results:
        print(f"\n{r['connections']} connections, idle, by thread: threads / cores / wakes per s")
        for name, g in r["by_thread"].items():
            print(f"  {name:40} {g['threads']:6} {g['cores']:8.4f} {g['wakes_per_s']:10.1f}")
    log(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
