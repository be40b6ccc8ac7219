#!/usr/bin/env python3
"""The phases of scripts/bench (see there and docs/performance.md); run by scripts/bench with
the project venv's python, the stack's environment (scripts/stack env) exported.

  bench.py --binary PATH --out FILE.json [--smoke] [--perf DIR]

Phases, each against baselines taken in the same run on the same backlog:
  produce   N Avro records (Confluent framing) over K keys on P partitions (bench_produce.py)
  kcat      `kcat -C -e` (read_committed) drains the backlog: the raw consume reference
  drain     the connector drains it, instant dispatcher, for each ordering (key, unordered)
  wrk       `wrk` POSTs the very event the connector sent (same headers, a unique
            Idempotency-Key per request) to the same dispatcher with the same connection count
  delay     the connector against a dispatcher holding each run D ms, at each concurrency
  latency   live traffic at half the measured drain rate (paced producer): event timestamp
            -> dispatcher arrival, p50/p99
Exit status 1 when a phase produced no figures, lost or duplicated an event, or broke key
order; speed never fails it.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


class Failure(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# /proc


def proc_cpu_ticks(pid):
    """utime + stime of a process, in clock ticks (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def proc_status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def thread_cpu(pid):
    """{thread name: ticks} summed over the threads of a process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
        except (OSError, ValueError):
            continue
    return out


def machine_ticks():
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])
    return total - idle, total


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


class Window:
    """CPU of named processes and of the machine between start() and stop()."""

    def __init__(self, pids):
        self.pids = {k: v for k, v in pids.items() if v}

    def start(self, connector_pid=None):
        self.t0 = time.monotonic()
        self.m0 = machine_ticks()
        self.p0 = {k: proc_cpu_ticks(p) for k, p in self.pids.items()}
        self.th0 = thread_cpu(connector_pid) if connector_pid else {}
        self.load0 = loadavg()

    def stop(self, connector_pid=None):
        self.t1 = time.monotonic()
        m1 = machine_ticks()
        p1 = {k: proc_cpu_ticks(p) for k, p in self.pids.items()}
        th1 = thread_cpu(connector_pid) if connector_pid else {}
        wall = self.t1 - self.t0
        busy, total = m1[0] - self.m0[0], m1[1] - self.m0[1]
        ncpu = os.cpu_count() or 1
        res = {
            "seconds": round(wall, 3),
            "loadavg_1m_at_start": self.load0[0],
            "machine_idle_share": round(1 - busy / total, 3) if total else None,
            "cpu_cores_busy": round(busy / total * ncpu, 2) if total else None,
            "cores": {},
        }
        proc_sum = 0.0
        for k in self.pids:
            if self.p0.get(k) is not None and p1.get(k) is not None:
                cores = (p1[k] - self.p0[k]) / CLK_TCK / wall
                res["cores"][k] = round(cores, 3)
                proc_sum += cores
        if res["cpu_cores_busy"] is not None:
            res["cores"]["everything_else"] = round(max(0.0, res["cpu_cores_busy"] - proc_sum), 3)
        if th1:
            threads = {n: (th1[n] - self.th0.get(n, 0)) / CLK_TCK / wall for n in th1}
            res["connector_threads_cores"] = {
                n: round(c, 3) for n, c in sorted(threads.items(), key=lambda x: -x[1]) if c >= 0.005}
        self.proc_ticks = {k: (p1[k] - self.p0[k]) if self.p0.get(k) is not None and p1.get(k) is not None else None
                           for k in self.pids}
        return res


# ---------------------------------------------------------------------------------------------
# the measuring dispatcher


class Dispatcher:
    def __init__(self, binary, hold_ms, logdir, name):
        self.log = open(os.path.join(logdir, f"{name}.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "dev-dispatcher", "--bench", "--listen", "127.0.0.1:0", "--latency-ms", str(hold_ms)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env={**os.environ, "RUST_LOG": "warn"})
        line = self.proc.stdout.readline()  # the process prints its address first, or dies
        m = re.search(r"http://([\d.]+):(\d+)(/\S*)", line)
        if not m:
            self.stop()
            raise Failure(f"dispatcher did not start: {line!r} (log {self.log.name})")
        self.host, self.port, self.path = m.group(1), int(m.group(2)), m.group(3)
        self.url = f"http://{self.host}:{self.port}{self.path}"
        self.conn = None

    @property
    def pid(self):
        return self.proc.pid

    def _request(self, method, path):
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                self.conn.request(method, path)
                r = self.conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise Failure(f"{method} {path}: {r.status} {body[:200]!r}")
                return json.loads(body)
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt:
                    raise
        return None

    def stats(self):
        return self._request("GET", "/stats")

    def reset(self):
        return self._request("POST", "/stats/reset")

    def sample(self):
        return self._request("GET", "/stats/sample")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------------------------------------
# the connector


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Connector:
    def __init__(self, binary, workdir, name, topic, group, url, concurrency, ordering):
        self.config = os.path.join(workdir, f"{name}.toml")
        with open(self.config, "w") as f:
            f.write(f"""# scripts/bench phase {name}
[server]
listen = "127.0.0.1:{free_port()}"

[connections.bench]
drain_timeout_ms = 10000
{os.environ.get("BENCH_CONNECTION_TOML", "")}
[connections.bench.kafka]
"bootstrap.servers" = "{os.environ['TESSEL_IT_BOOTSTRAP']}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
{os.environ.get("BENCH_KAFKA_TOML", "")}
[connections.bench.schema_registry]
url = "{os.environ['TESSEL_IT_REGISTRY_URL']}"
[connections.bench.triggers.bench]
topics = ["{topic}"]
workflow = "bench"
concurrency = {concurrency}
ordering = "{ordering}"
key_format = "string"
value_format = "schema_registry"
dispatcher = {{ url = "{url}", timeout_ms = 10000 }}
{os.environ.get("BENCH_TRIGGER_TOML", "")}
""")
        self.log = open(os.path.join(workdir, f"{name}.log"), "w")
        env = {k: v for k, v in os.environ.items() if k != "RUST_LOG" and not k.startswith("TESSEL_KAFKA__")}
        self.proc = subprocess.Popen([binary, "run", "--config", self.config],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self.log, env=env)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM (the connector drains and commits), SIGKILL after 20 s; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                log(f"connector {self.pid} did not stop within 20 s: SIGKILL")
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class KcatLatency:
    """kcat consuming a live topic from its end: record timestamp -> line read here, the
    consume-only reference for the connector's timestamp -> dispatcher latency."""

    def __init__(self, topic):
        self.proc = subprocess.Popen(
            ["kcat", "-C", "-b", os.environ["TESSEL_IT_BOOTSTRAP"], "-t", topic, "-o", "end", "-u", "-q",
             "-X", "isolation.level=read_committed", "-f", "%T\n"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.measuring = False
        self.latencies = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @property
    def pid(self):
        return self.proc.pid

    def _read(self):
        for line in self.proc.stdout:
            now_ms = time.time() * 1000
            if self.measuring:
                try:
                    self.latencies.append(now_ms - int(line))
                except ValueError:
                    pass

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.reader.join(10)
        lat = sorted(self.latencies)
        if not lat:
            return {"count": 0}

        def q(x):
            return round(lat[min(len(lat) - 1, max(0, int(x * len(lat) + 0.999999) - 1))], 3)

        return {"count": len(lat), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(lat[-1], 3)}


# ---------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        smoke = args.smoke
        self.records = env_int("BENCH_RECORDS", 2_000 if smoke else 200_000)
        self.partitions = env_int("BENCH_PARTITIONS", 8)
        self.keys = env_int("BENCH_KEYS", 1_000)
        self.concurrency = env_int("BENCH_CONCURRENCY", 64)
        self.orderings = os.environ.get("BENCH_ORDERINGS", "key,unordered").split(",")
        self.hold_ms = env_int("BENCH_DELAY_MS", 5)
        self.delay_concurrency = [int(c) for c in os.environ.get("BENCH_DELAY_CONCURRENCY", "64,256").split(",") if c]
        self.delay_events = env_int("BENCH_DELAY_EVENTS", min(self.records, 100_000))
        self.wrk_seconds = env_int("BENCH_WRK_SECONDS", 2 if smoke else 10)
        self.wrk_threads = env_int("BENCH_WRK_THREADS", 2)
        self.latency_seconds = env_int("BENCH_LATENCY_SECONDS", 4 if smoke else 20)
        self.latency_warmup = env_int("BENCH_LATENCY_WARMUP_SECONDS", 1 if smoke else 3)
        self.latency_rate = env_int("BENCH_LATENCY_RATE", 0)
        self.drain_deadline = env_int("BENCH_DRAIN_DEADLINE_SECONDS", 60 + self.records // 200)
        self.python = sys.executable
        run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        self.run_id = run_id
        self.topic = f"bench-{run_id}"
        self.workdir = tempfile.mkdtemp(prefix=f"bench-{run_id}-", dir=args.workdir)
        self.broker_pid = None
        try:
            with open(os.environ["TESSEL_IT_BROKER_PID"]) as f:
                self.broker_pid = int(f.read().split()[0])
        except (KeyError, OSError, ValueError, IndexError):
            pass
        self.problems = []
        self.result = {
            "run_id": run_id,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "smoke": smoke,
            "binary": args.binary,
            "git": args.git,
            "machine": {"cpus": os.cpu_count(), "loadavg_at_start": loadavg(),
                        "kernel": os.uname().release},
            "kafka_version": os.environ.get("TESSEL_IT_KAFKA_VERSION"),
            "workload": {"records": self.records, "partitions": self.partitions, "keys": self.keys,
                         "concurrency": self.concurrency, "orderings": self.orderings,
                         "format": "avro (Confluent framing), 6 fields", "dispatcher": "202 at once"},
            "phases": {},
        }

    def problem(self, msg):
        log(f"PROBLEM: {msg}")
        self.problems.append(msg)

    # -- helpers ------------------------------------------------------------------------------

    def produce(self, spec):
        spec = {"bootstrap": os.environ["TESSEL_IT_BOOTSTRAP"],
                "registry": os.environ["TESSEL_IT_REGISTRY_URL"], "keys": self.keys, **spec}
        r = subprocess.run([self.python, os.path.join(HERE, "bench_produce.py")],
                           input=json.dumps(spec), capture_output=True, text=True)
        if r.returncode != 0:
            raise Failure(f"producer failed ({r.returncode}): {r.stderr[-2000:]}")
        return json.loads(r.stdout)

    def create_topic(self, topic):
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": os.environ["TESSEL_IT_BOOTSTRAP"], "log_level": 3})
        fut = admin.create_topics([NewTopic(topic, self.partitions, 1)], operation_timeout=30)
        fut[topic].result(60)

    def pids(self, connector=None, dispatcher=None):
        return {"connector": connector, "dispatcher": dispatcher, "broker": self.broker_pid,
                "bench_script": os.getpid()}

    def wait(self, what, deadline_s, check, interval=0.05):
        """Polls check() until it returns a true value; Failure past the deadline."""
        end = time.monotonic() + deadline_s
        while True:
            v = check()
            if v:
                return v
            if time.monotonic() > end:
                raise Failure(f"timed out after {deadline_s} s waiting for {what}")
            time.sleep(interval)

    # -- phases -------------------------------------------------------------------------------

    def phase_produce(self):
        log(f"producing {self.records} Avro records over {self.keys} keys to {self.topic} "
            f"({self.partitions} partitions)")
        self.create_topic(self.topic)
        r = self.produce({"mode": "backlog", "topic": self.topic, "count": self.records})
        self.result["phases"]["produce"] = r
        self.result["workload"]["value_bytes"] = r["value_bytes"]
        log(f"produced {r['produced']} in {r['seconds']} s ({r['rate']:.0f}/s), "
            f"{r['value_bytes']} bytes per value")

    def phase_kcat(self):
        if not shutil.which("kcat"):
            self.problem("kcat is not installed (scripts/deps --bench)")
            return
        log("kcat drain (read_committed)")
        t0 = time.monotonic()
        p = subprocess.Popen(["kcat", "-C", "-b", os.environ["TESSEL_IT_BOOTSTRAP"], "-t", self.topic,
                              "-o", "beginning", "-e", "-q", "-X", "isolation.level=read_committed",
                              "-f", "%p\n"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        w = Window({**self.pids(), "kcat": p.pid})
        w.start()
        count = 0
        while True:
            chunk = p.stdout.read(1 << 16)
            if not chunk:
                break
            count += chunk.count(b"\n")
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        win = w.stop()
        err = p.stderr.read().decode(errors="replace")[-500:]
        if p.returncode != 0 or count != self.records:
            self.problem(f"kcat read {count} of {self.records} records (exit {p.returncode}) {err}")
        cpu_us = (usage.ru_utime + usage.ru_stime) * 1e6
        self.result["phases"]["kcat"] = {
            "records": count, "seconds": round(wall, 3), "rate": round(count / wall, 1),
            "cpu_us_per_event": round(cpu_us / max(count, 1), 2), "window": win}
        log(f"kcat: {count} in {wall:.2f} s = {count / wall:.0f}/s")

    def drain(self, name, dispatcher, ordering, concurrency, target, full, perf=False):
        """One connector, fresh group, from the start of the backlog until `target` runs
        arrived (full: the whole backlog, which must arrive exactly once)."""
        group = f"bench-{self.run_id}-{name}"
        dispatcher.reset()
        c = Connector(self.args.binary, self.workdir, name, self.topic, group, dispatcher.url,
                      concurrency, ordering)
        w = Window(self.pids(c.pid, dispatcher.pid))
        perf_proc = None
        try:
            started = time.monotonic()
            def first_run():
                if not c.alive():
                    return "dead"
                return dispatcher.stats()["runs"] > 0

            if self.wait(f"{name}: first run", 120, first_run) == "dead":
                raise Failure(f"{name}: the connector exited ({c.proc.returncode}); log {c.log.name}")
            runs0 = dispatcher.stats()["runs"]
            w.start(c.pid)
            # BENCH_PERF_PHASE names the phase to profile (e.g. delay-5ms-c256); by default the
            # first drain.
            wanted = os.environ.get("BENCH_PERF_PHASE")
            if self.args.perf and (name == wanted if wanted else perf):
                os.makedirs(self.args.perf, exist_ok=True)
                out = os.path.join(self.args.perf, f"{name}.perf.data")
                perf_proc = subprocess.Popen(
                    ["perf", "record", "-F", os.environ.get("BENCH_PERF_FREQ", "249"),
                     "--call-graph", os.environ.get("BENCH_PERF_CALLGRAPH", "dwarf,8192"),
                     "-p", str(c.pid), "-o", out],
                    stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, "perf.log"), "w"))
                log(f"{name}: perf record -> {out}")

            def reached():
                if not c.alive():
                    return "dead"
                s = dispatcher.stats()
                return s if s["runs"] >= target else None

            s = self.wait(f"{name}: {target} runs", self.drain_deadline, reached)
            if s == "dead":
                raise Failure(f"{name}: the connector exited ({c.proc.returncode}); log {c.log.name}")
            win = w.stop(c.pid)
            hwm = proc_status_kib(c.pid, "VmHWM")
            total_s = time.monotonic() - started
        finally:
            if perf_proc:
                perf_proc.send_signal(signal.SIGINT)
                perf_proc.wait(120)
            rc = c.stop()
        if full:
            # Whatever arrives after the last record (a duplicate while stopping) counts too.
            s = dispatcher.stats()
        runs = s["runs"]
        events = runs - runs0
        cpu_ticks = w.proc_ticks.get("connector")
        res = {
            "ordering": ordering, "concurrency": concurrency, "hold_ms": s["hold_ms"],
            "runs": runs, "duplicates": s["duplicates"], "order_violations": s["order_violations"],
            "order_checked": s["order_checked"],
            "rate": round(s["arrival_rate"], 1),
            "cpu_us_per_event": round(cpu_ticks / CLK_TCK * 1e6 / events, 2) if cpu_ticks and events else None,
            "peak_rss_mib": round(hwm / 1024, 1) if hwm else None,
            "in_flight_peak": s["in_flight_peak"],
            "held_mean_ms": round(s["held_mean_ms"], 3),
            "latency_ms": s["latency_ms"],
            "seconds_from_start": round(total_s, 2),
            "connector_exit": rc,
            "window": win,
        }
        if s["duplicates"]:
            self.problem(f"{name}: {s['duplicates']} duplicated events")
        if full and runs != self.records:
            self.problem(f"{name}: {runs} runs for {self.records} records")
        if ordering == "key" and s["order_violations"]:
            self.problem(f"{name}: {s['order_violations']} runs out of key order")
        if rc not in (0, None):
            self.problem(f"{name}: connector exit status {rc} (log {c.log.name})")
        log(f"{name}: {res['rate']:.0f} events/s, {res['cpu_us_per_event']} µs CPU/event, "
            f"peak in flight {res['in_flight_peak']}, idle {win['machine_idle_share']}, "
            f"load {win['loadavg_1m_at_start']}")
        return res

    def phase_drains(self, dispatcher):
        for ordering in self.orderings:
            name = f"drain-{ordering}"
            self.result["phases"][name] = self.drain(
                name, dispatcher, ordering, self.concurrency, self.records, full=True,
                perf=(ordering == self.orderings[0]))
            if ordering == self.orderings[0]:
                try:
                    self.sample = dispatcher.sample()
                except Failure as e:
                    self.problem(f"no sample request: {e}")

    def sample_request(self, who):
        """The connector's first request, for the baselines that replay it: the path of its
        body (written once) and its headers, less those each request sets for itself. None
        (and a problem noted) without a sample."""
        sample = getattr(self, "sample", None)
        if not sample:
            self.problem(f"{who}: no sample event")
            return None
        body_path = os.path.join(self.workdir, "event.json")
        if not os.path.exists(body_path):
            with open(body_path, "w") as f:
                f.write(sample["body"])
        per_request = {"host", "content-length", "idempotency-key", "connection"}
        return body_path, [(n, v) for n, v in sample["headers"] if n.lower() not in per_request]

    def sample_batch_events(self):
        """How many events the sample carries when it is a batch trigger's, else None.
        Replaying a batch repeats its events by design (only the Idempotency-Key changes)."""
        try:
            events = json.loads(self.sample["body"]).get("events")
        except (ValueError, AttributeError):
            events = None
        return len(events) if isinstance(events, list) else None

    def wrk_script(self):
        """Writes post.lua (once): wrk POSTs the connector's own event with a unique
        Idempotency-Key per request, prefixed by the script argument so that several wrk runs
        against one dispatcher never repeat a key. None (and a problem noted) when it cannot."""
        if getattr(self, "wrk_lua", None):
            return self.wrk_lua
        if not shutil.which("wrk"):
            self.problem("wrk is not installed (scripts/deps --bench)")
            return None
        request = self.sample_request("wrk")
        if not request:
            return None
        body_path, headers = request
        lua = os.path.join(self.workdir, "post.lua")
        with open(lua, "w") as f:
            f.write("-- scripts/bench: POST the connector's event, a unique Idempotency-Key per request\n")
            f.write('wrk.method = "POST"\n')
            f.write(f"local f = assert(io.open({json.dumps(body_path)}, 'rb'))\n")
            f.write("wrk.body = f:read('*a')\nf:close()\n")
            for n, v in headers:
                f.write(f"wrk.headers[{json.dumps(n)}] = {json.dumps(v)}\n")
            f.write("local threads = 0\n")
            f.write("function setup(thread) threads = threads + 1; thread:set('tid', threads) end\n")
            f.write("local prefix = 'wrk'\n")
            f.write("function init(args) if args[1] then prefix = args[1] end end\n")
            f.write("local n = 0\n")
            f.write("function request()\n  n = n + 1\n"
                    "  wrk.headers['Idempotency-Key'] = prefix .. ':' .. tid .. ':' .. n\n"
                    "  return wrk.format()\nend\n")
        self.wrk_lua = lua
        return lua

    def run_wrk(self, dispatcher, connections, seconds, tag):
        """wrk -c`connections` for `seconds` against `dispatcher` (reset first): its rate,
        the dispatcher's figures and the processes' CPU; None when it failed."""
        lua = self.wrk_script()
        if not lua:
            return None
        sample = self.sample
        dispatcher.reset()
        log(f"wrk -t{self.wrk_threads} -c{connections} -d{seconds}s against the dispatcher (keys {tag}:*)")
        p = subprocess.Popen(["wrk", f"-t{self.wrk_threads}", f"-c{connections}", f"-d{seconds}s",
                              "-s", lua, dispatcher.url, "--", tag],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        w = Window({**self.pids(None, dispatcher.pid), "wrk": p.pid})
        w.start()
        # wrk exits by itself after its duration; the window closes just before it does.
        time.sleep(seconds - 0.2)
        win = w.stop()
        stdout, stderr = p.communicate(timeout=60)
        r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        s = dispatcher.stats()
        m = re.search(r"Requests/sec:\s*([\d.]+)", r.stdout)
        total = re.search(r"(\d+) requests in", r.stdout)
        non2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", r.stdout)
        if r.returncode != 0 or not m:
            self.problem(f"wrk failed ({r.returncode}): {r.stdout[-500:]} {r.stderr[-500:]}")
            return None
        res = {"rate": float(m.group(1)), "requests": int(total.group(1)) if total else None,
               "non_2xx": int(non2xx.group(1)) if non2xx else 0, "dispatcher_runs": s["runs"],
               "duplicates": s["duplicates"], "threads": self.wrk_threads,
               "connections": connections, "body_bytes": len(sample["body"].encode()),
               "held_mean_ms": round(s["held_mean_ms"], 3), "window": win}
        # A batch trigger's sample is a batch: wrk sends the same events again and again (only
        # the Idempotency-Key changes), so its events are duplicates by design; the rate is of
        # batch requests, each of `events_per_request` events.
        batch = self.sample_batch_events()
        res["events_per_request"] = batch if batch is not None else 1
        if res["non_2xx"] or (s["duplicates"] and batch is None):
            self.problem(f"wrk: {res['non_2xx']} non-2xx answers, {s['duplicates']} duplicates")
        return res

    def phase_wrk(self, dispatcher):
        res = self.run_wrk(dispatcher, self.concurrency, self.wrk_seconds, "wrk")
        if res:
            w = res["window"]["cores"].get("wrk")
            res["cpu_us_per_request"] = round(w * 1e6 / res["rate"], 2) if w and res["rate"] else None
            self.result["phases"]["wrk"] = res
            log(f"wrk: {res['rate']:.0f} requests/s, body {res['body_bytes']} bytes, "
                f"{res['cpu_us_per_request']} µs CPU/request")

    def phase_client(self, dispatcher):
        """The connector's own HTTP client (`tessel-kafka dev-http-load`: the trigger's
        HttpDispatcher, its pool and headers) POSTing the same event to the same dispatcher
        with as many connections as wrk: the HTTP path of a run without Kafka."""
        request = self.sample_request("client")
        if not request:
            return
        body_path, headers = request
        args = [self.args.binary, "dev-http-load", "--url", dispatcher.url, "--body", body_path,
                "--connections", str(self.concurrency), "--seconds", str(self.wrk_seconds),
                "--key-prefix", f"client-{self.run_id}"]
        # The same headers wrk sends (a configured header takes the place of the client's
        # own Content-Type and User-Agent, with the same values).
        for n, v in headers:
            args += ["--header", f"{n}: {v}"]
        dispatcher.reset()
        log(f"client: the connector's HTTP client, {self.concurrency} connections, {self.wrk_seconds} s")
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "RUST_LOG": "warn"})
        w = Window({**self.pids(None, dispatcher.pid), "client": p.pid})
        w.start()
        time.sleep(max(0.1, self.wrk_seconds - 0.2))
        win = w.stop()
        out, err = p.communicate(timeout=60)
        if p.returncode != 0:
            self.problem(f"client failed ({p.returncode}): {err[-500:]}")
            return
        r = json.loads(out)
        s = dispatcher.stats()
        cores = win["cores"].get("client")
        res = {**r, "connections": self.concurrency, "dispatcher_runs": s["runs"],
               "duplicates": s["duplicates"],
               "cpu_us_per_request": round(cores * 1e6 / r["rate"], 2) if cores and r["rate"] else None,
               "window": win}
        if r["accepted"] != r["requests"] or (s["duplicates"] and self.sample_batch_events() is None):
            self.problem(f"client: {r['requests'] - r['accepted']} requests not accepted "
                         f"({r.get('first_failure')}), {s['duplicates']} duplicates")
        self.result["phases"]["client"] = res
        log(f"client: {r['rate']:.0f} requests/s, {res['cpu_us_per_request']} µs CPU/request")

    def phase_delay(self):
        d = Dispatcher(self.args.binary, self.hold_ms, self.workdir, f"dispatcher-hold-{self.hold_ms}ms")
        try:
            for c in self.delay_concurrency:
                name = f"delay-{self.hold_ms}ms-c{c}"
                target = self.delay_events
                res = self.drain(name, d, "key", c, target, full=(target >= self.records))
                res["ideal_rate"] = c * 1000.0 / self.hold_ms
                res["ratio_to_ideal"] = round(res["rate"] / res["ideal_rate"], 3)
                if res["held_mean_ms"]:
                    res["ratio_to_ideal_at_measured_hold"] = round(
                        res["rate"] / (c * 1000.0 / res["held_mean_ms"]), 3)
                # The same held dispatcher under wrk at the same concurrency: what an HTTP
                # client that does nothing else gets from it on this machine.
                base = self.run_wrk(d, c, min(self.wrk_seconds, 5), f"wrk-{name}")
                if base:
                    base["ratio_to_ideal"] = round(base["rate"] / res["ideal_rate"], 3)
                    res["wrk"] = base
                    log(f"{name}: wrk {base['rate']:.0f} requests/s ({base['ratio_to_ideal']} of the "
                        f"ideal), mean hold {base['held_mean_ms']} ms")
                self.result["phases"][name] = res
        finally:
            d.stop()

    def phase_latency(self, dispatcher):
        drain = self.result["phases"].get(f"drain-{self.orderings[0]}")
        if self.latency_rate:
            rate = self.latency_rate
        elif drain and drain["rate"]:
            rate = max(10, int(drain["rate"] / 2))
        else:
            self.problem("latency: no drain rate to take half of")
            return
        topic = f"{self.topic}-live"
        self.create_topic(topic)
        group = f"bench-{self.run_id}-latency"
        dispatcher.reset()
        c = Connector(self.args.binary, self.workdir, "latency", topic, group, dispatcher.url,
                      self.concurrency, self.orderings[0])
        log(f"latency: paced producer at {rate}/s for {self.latency_warmup}+{self.latency_seconds} s")
        # The connector joins the group first (a record produced before that waits for the join).
        warm = self.produce({"mode": "paced", "topic": topic, "rate": 20, "seconds": 0.2})
        self.wait("latency: connector consuming", 120,
                  lambda: dispatcher.stats()["runs"] >= warm["produced"] or not c.alive())
        if not c.alive():
            raise Failure(f"latency: the connector exited ({c.proc.returncode}); log {c.log.name}")
        spec = {"bootstrap": os.environ["TESSEL_IT_BOOTSTRAP"], "registry": os.environ["TESSEL_IT_REGISTRY_URL"],
                "keys": self.keys, "mode": "paced", "topic": topic, "rate": rate,
                "seconds": self.latency_warmup + self.latency_seconds}
        # The reference: kcat consuming the same live traffic, its timestamp -> line read.
        reference = KcatLatency(topic)
        spec_path = os.path.join(self.workdir, "paced.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        with open(spec_path) as spec_file:
            prod = subprocess.Popen([self.python, os.path.join(HERE, "bench_produce.py")],
                                    stdin=spec_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        w = Window({**self.pids(c.pid, dispatcher.pid), "producer": prod.pid, "kcat": reference.pid})
        try:
            # Warm-up (the producer's first schema lookup, connections): measured from the end of it.
            time.sleep(self.latency_warmup)
            before = dispatcher.reset()
            reference.measuring = True
            w.start(c.pid)
            # The CPU window closes just before the producer stops (so that its CPU is counted).
            time.sleep(max(0.1, self.latency_seconds - 0.3))
            win = w.stop(c.pid)
            out, err = prod.communicate(timeout=120)
            if prod.returncode != 0:
                raise Failure(f"paced producer failed: {err[-2000:]}")
            p = json.loads(out)
            expected = p["produced"] + warm["produced"]

            def caught_up():
                st = dispatcher.stats()
                return st if before["runs"] + st["runs"] >= expected or not c.alive() else None

            self.wait("latency: every record dispatched", 60, caught_up)
        finally:
            if prod.poll() is None:
                prod.kill()
            rc = c.stop()
            kcat_latency = reference.stop()
        s = dispatcher.stats()
        res = {"offered_rate": rate, "produced_rate": p["rate"], "runs": s["runs"],
               "duplicates": s["duplicates"] + before["duplicates"],
               "order_violations": s["order_violations"] + before["order_violations"],
               "latency_ms": s["latency_ms"], "kcat_latency_ms": kcat_latency,
               "in_flight_peak": s["in_flight_peak"],
               "connector_exit": rc, "window": win}
        conn = win["cores"].get("connector")
        res["cpu_us_per_event"] = round(conn * 1e6 / p["rate"], 2) if conn and p["rate"] else None
        total = before["runs"] + s["runs"]
        if total != expected:
            self.problem(f"latency: {total} runs for {expected} records")
        if res["duplicates"]:
            self.problem(f"latency: {res['duplicates']} duplicated events")
        if self.orderings[0] == "key" and res["order_violations"]:
            self.problem(f"latency: {res['order_violations']} runs out of key order")
        self.result["phases"]["latency"] = res
        lat = s["latency_ms"]
        log(f"latency at {rate}/s: p50 {lat.get('p50')} ms, p99 {lat.get('p99')} ms, max {lat.get('max')} ms; "
            f"kcat p50 {kcat_latency.get('p50')} ms, p99 {kcat_latency.get('p99')} ms")

    # -- the run ------------------------------------------------------------------------------

    def run(self):
        t0 = time.monotonic()
        try:
            self.phase_produce()
            self.phase_kcat()
            d0 = Dispatcher(self.args.binary, 0, self.workdir, "dispatcher")
            try:
                self.phase_drains(d0)
                self.phase_wrk(d0)
                self.phase_client(d0)
                if self.delay_concurrency:
                    self.phase_delay()
                if self.latency_seconds > 0:
                    self.phase_latency(d0)
            finally:
                d0.stop()
        except Failure as e:
            self.problem(str(e))
        self.result["seconds"] = round(time.monotonic() - t0, 1)
        self.result["machine"]["loadavg_at_end"] = loadavg()
        self.result["figures"] = self.figures()
        self.result["problems"] = self.problems
        self.result["workdir"] = self.workdir
        return self.result

    def figures(self):
        ph = self.result["phases"]
        wrk = ph.get("wrk", {}).get("rate")
        kcat = ph.get("kcat", {}).get("rate")
        rows = []

        def row(figure, value, baseline=None, ratio=None, target=None, load=None):
            rows.append({"figure": figure, "value": value, "baseline": baseline, "ratio": ratio,
                         "target": target, "load": load})

        def load_of(p):
            w = p.get("window", {})
            return {"idle": w.get("machine_idle_share"), "loadavg_1m": w.get("loadavg_1m_at_start"),
                    "others_cores": w.get("cores", {}).get("everything_else")}

        for o in self.orderings:
            d = ph.get(f"drain-{o}")
            if not d:
                continue
            row(f"drain {o}, c{d['concurrency']}, events/s", d["rate"], f"wrk {wrk:.0f}/s" if wrk else None,
                round(d["rate"] / wrk, 3) if wrk else None, ">= 0.5 (0.8)", load_of(d))
            # The CPU of a run against what its two halves cost alone on this machine: reading
            # the record (kcat) and POSTing it (the connector's own HTTP client; wrk).
            client = ph.get("client", {}).get("cpu_us_per_request")
            floor = (client or 0) + (ph["kcat"]["cpu_us_per_event"] if kcat else 0)
            row(f"drain {o}: connector CPU µs/event", d["cpu_us_per_event"],
                f"client+kcat {floor:.3g}" if client else
                (f"kcat {ph['kcat']['cpu_us_per_event']}" if kcat else None),
                round(d["cpu_us_per_event"] / floor, 3) if client and d["cpu_us_per_event"] else None,
                "<= 15 (8)", load_of(d))
            row(f"drain {o}: peak RSS MiB", d["peak_rss_mib"], None, None, None, load_of(d))
            row(f"drain {o}: peak runs in flight", d["in_flight_peak"], f"of {d['concurrency']}",
                round(d["in_flight_peak"] / d["concurrency"], 3), None, load_of(d))
            row(f"drain {o}: machine idle share", d["window"]["machine_idle_share"], None, None, None, load_of(d))
            if kcat:
                row(f"drain {o} ÷ kcat drain", d["rate"], f"kcat {kcat:.0f}/s", round(d["rate"] / kcat, 4),
                    None, load_of(d))
        for c in self.delay_concurrency:
            d = ph.get(f"delay-{self.hold_ms}ms-c{c}")
            if d:
                row(f"{self.hold_ms} ms dispatcher, c{c}, runs/s", d["rate"], f"ideal {d['ideal_rate']:.0f}/s",
                    d["ratio_to_ideal"], ">= 0.9", load_of(d))
                row(f"{self.hold_ms} ms dispatcher, c{c}: mean hold ms", d["held_mean_ms"], None, None, None, load_of(d))
                b = d.get("wrk")
                if b:
                    row(f"{self.hold_ms} ms dispatcher, c{c}: wrk req/s", b["rate"], f"ideal {d['ideal_rate']:.0f}/s",
                        b["ratio_to_ideal"], None, load_of(b))
                    row(f"{self.hold_ms} ms dispatcher, c{c}: runs ÷ wrk", d["rate"], f"wrk {b['rate']:.0f}/s",
                        round(d["rate"] / b["rate"], 3), None, load_of(d))
                row(f"{self.hold_ms} ms dispatcher, c{c}: peak in flight", d["in_flight_peak"], f"of {c}",
                    round(d["in_flight_peak"] / c, 3), None, load_of(d))
        c = ph.get("client")
        if c:
            row(f"HTTP client alone, c{c['connections']}, req/s", c["rate"], f"wrk {wrk:.0f}/s" if wrk else None,
                round(c["rate"] / wrk, 3) if wrk else None, None, load_of(c))
            wcpu = ph.get("wrk", {}).get("cpu_us_per_request")
            row("HTTP client alone: CPU µs/request", c["cpu_us_per_request"], f"wrk {wcpu}" if wcpu else None,
                round(c["cpu_us_per_request"] / wcpu, 3) if wcpu and c["cpu_us_per_request"] else None,
                None, load_of(c))
        lat = ph.get("latency")
        if lat:
            l = lat["latency_ms"]
            k = lat.get("kcat_latency_ms") or {}

            def vs_kcat(q):
                if k.get(q) is None:
                    return None, None
                return f"kcat {k[q]:.3g} ms", (round(l[q] / k[q], 2) if k[q] > 0 and l.get(q) is not None else None)

            row(f"live {lat['offered_rate']}/s: p50 ms", l.get("p50"), *vs_kcat("p50"), None, load_of(lat))
            row(f"live {lat['offered_rate']}/s: p99 ms", l.get("p99"), *vs_kcat("p99"), "<= 20", load_of(lat))
            row(f"live {lat['offered_rate']}/s: max ms", l.get("max"), None, None, None, load_of(lat))
            row(f"live {lat['offered_rate']}/s: connector CPU µs/event", lat.get("cpu_us_per_event"), None, None,
                None, load_of(lat))
        if wrk:
            row(f"wrk -c{self.concurrency} req/s (ceiling)", wrk, None, None, None, load_of(ph["wrk"]))
            row(f"wrk -c{self.concurrency}: CPU µs/request", ph["wrk"].get("cpu_us_per_request"), None, None, None,
                load_of(ph["wrk"]))
        if kcat:
            row("kcat -C -e read_committed records/s", kcat, None, None, None, load_of(ph["kcat"]))
        return rows


def print_table(result):
    rows = result["figures"]
    print()
    print(f"scripts/bench {'--smoke ' if result['smoke'] else ''}run {result['run_id']} "
          f"({result['workload']['records']} records, {result['workload']['partitions']} partitions, "
          f"{result['workload']['keys']} keys, {result['git']})")
    hdr = f"{'figure':<40} {'value':>10} {'baseline':>16} {'ratio':>7} {'target':>12}  {'idle':>5} {'load1':>5} {'others':>6}"
    print(hdr)
    print("-" * len(hdr))

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    for r in rows:
        ld = r["load"] or {}
        print(f"{r['figure']:<40} {fmt(r['value']):>10} {fmt(r['baseline']):>16} {fmt(r['ratio']):>7} "
              f"{fmt(r['target']):>12}  {fmt(ld.get('idle')):>5} {fmt(ld.get('loadavg_1m')):>5} "
              f"{fmt(ld.get('others_cores')):>6}")
    print("(idle: the machine's idle share during the phase; load1: 1-minute load average at its start; "
          "others: cores busy outside the processes of the phase: connector, dispatcher, broker, kcat, wrk, "
          "paced producer, this script)")
    if result["problems"]:
        print("PROBLEMS:")
        for p in result["problems"]:
            print(f"  - {p}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--perf", help="perf record the first drain into this directory")
    ap.add_argument("--git", default="")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    bench = Bench(args)
    result = bench.run()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)
    print(f"\nJSON: {args.out}")
    figures = [r for r in result["figures"] if r["value"] is not None]
    if not figures:
        result["problems"].append("no figures")
    sys.exit(1 if result["problems"] else 0)


if __name__ == "__main__":
    main()
