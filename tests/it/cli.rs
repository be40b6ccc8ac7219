//! The binary refuses bad configuration with one line naming the key, before connecting.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{binary, temp_config};

const GOOD: &str = r#"
[connections.orders.kafka]
"bootstrap.servers" = "127.0.0.1:1"
"group.id" = "g"

[connections.orders.triggers.t]
topics = ["payments"]
workflow = "w"
dispatcher = { url = "http://127.0.0.1:1/runs" }
"#;

fn run_with(text: &str) -> (bool, String, Duration) {
    let path = temp_config(text);
    let started = Instant::now();
    let out = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .expect("run binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

fn assert_refused(text: &str, key: &str) {
    let (ok, stderr, took) = run_with(text);
    assert!(!ok, "config was accepted: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    assert!(
        lines[0].contains(key),
        "error does not name {key}: {stderr}"
    );
    // It fails before any connection: the unreachable broker would take seconds.
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn missing_bootstrap_servers_is_refused() {
    assert_refused(
        &GOOD.replace("\"bootstrap.servers\" = \"127.0.0.1:1\"\n", ""),
        "bootstrap.servers",
    );
}

#[test]
fn unknown_key_is_refused() {
    assert_refused(
        &GOOD.replace("workflow = \"w\"", "workflow = \"w\"\ncuncurrency = 3"),
        "cuncurrency",
    );
}

#[test]
fn trigger_without_topics_is_refused() {
    assert_refused(
        &GOOD.replace("topics = [\"payments\"]", "topics = []"),
        "triggers.t.topics",
    );
}

#[test]
fn read_uncommitted_is_refused() {
    assert_refused(
        &GOOD.replace(
            "\"group.id\" = \"g\"",
            "\"group.id\" = \"g\"\n\"isolation.level\" = \"read_uncommitted\"",
        ),
        "isolation.level",
    );
}

#[test]
fn config_check_prints_effective_config_without_secrets() {
    let text = GOOD
        .replace(
            "\"group.id\" = \"g\"",
            "\"group.id\" = \"g\"\n\"sasl.password\" = \"pw-9f3a1\"",
        )
        .replace(
            "dispatcher = { url = \"http://127.0.0.1:1/runs\" }",
            "dispatcher = { url = \"http://127.0.0.1:1/runs\", token = \"tok-77c2\" }",
        );
    let path = temp_config(&text);
    let out = Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("concurrency = 16"), "{stdout}");
    assert!(
        !stdout.contains("pw-9f3a1") && !stdout.contains("tok-77c2"),
        "{stdout}"
    );
}

#[test]
fn config_check_json_is_the_effective_config_without_secrets() {
    let text = GOOD
        .replace(
            "\"group.id\" = \"g\"",
            "\"group.id\" = \"g\"\n\"sasl.password\" = \"pw-9f3a1\"",
        )
        .replace(
            "dispatcher = { url = \"http://127.0.0.1:1/runs\" }",
            "dispatcher = { url = \"http://u:pr0xy-pw@127.0.0.1:1/runs\", token = \"tok-77c2\" }",
        );
    let path = temp_config(&text);
    let out = Command::new(binary())
        .args(["config", "check", "--json", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let value: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let trigger = &value["config"]["connections"]["orders"]["triggers"]["t"];
    assert_eq!(trigger["concurrency"], 16);
    assert_eq!(trigger["dispatcher"]["token"], "***redacted***");
    assert_eq!(trigger["dispatcher"]["url"], "http://***@127.0.0.1:1/runs");
    assert_eq!(
        value["config"]["connections"]["orders"]["kafka"]["sasl.password"],
        "***redacted***"
    );
    assert_eq!(value["notices"], serde_json::json!([]));
    for secret in ["pw-9f3a1", "tok-77c2", "pr0xy-pw"] {
        assert!(!stdout.contains(secret), "{stdout}");
    }
}

/// Every file in config/examples/ passes `config check` with dummy secrets from the
/// environment, prints its translations as notes, and never prints a secret.
#[test]
fn example_configs_pass_config_check_without_printing_secrets() {
    let secrets: &[(&str, &str)] = &[
        ("KAFKA_PASSWORD", "dummy-kafka-password"),
        ("REGISTRY_PASSWORD", "dummy-registry-password"),
        ("TESSEL_TOKEN", "dummy-tessel-token"),
        (
            "CONFLUENT_JAAS_CONFIG",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="CCKEY" password="dummy-confluent-secret";"#,
        ),
        ("CONFLUENT_SR_USER_INFO", "SR-API-KEY:dummy-sr-secret"),
        ("MSK_SCRAM_PASSWORD", "dummy-msk-password"),
        ("AIVEN_REGISTRY_PASSWORD", "dummy-aiven-registry"),
        (
            "AIVEN_JAAS_CONFIG",
            r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="avnadmin" password="dummy-aiven-password";"#,
        ),
        ("REDPANDA_PASSWORD", "dummy-redpanda-password"),
        ("TESSEL_PRODUCE_TOKEN", "dummy-produce-token-0123"),
        ("ANALYTICS_KAFKA_PASSWORD", "dummy-analytics-password"),
    ];
    let dir = crate::support::repo().join("config/examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("config/examples") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let out = Command::new(binary())
            .args(["config", "check", "--config"])
            .arg(&path)
            .envs(secrets.iter().copied())
            .output()
            .expect("run config check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{}: {text}", path.display());
        for (_, value) in secrets {
            assert!(
                !text.contains("dummy-"),
                "{} prints a secret ({value}): {text}",
                path.display()
            );
        }
        let pasted_jaas = std::fs::read_to_string(&path)
            .unwrap()
            .contains("\"sasl.jaas.config\"");
        if pasted_jaas {
            let noted = text.lines().any(|l| {
                l.starts_with("# note: connection orders: ") && l.contains("\"sasl.jaas.config\"")
            });
            assert!(noted, "no note about sasl.jaas.config: {text}");
        }
        checked += 1;
    }
    assert_eq!(checked, 8, "an example is missing");
}

#[test]
fn a_toml_syntax_error_names_the_file_line_and_column() {
    let text = GOOD.replace("workflow = \"w\"", "workflow = \"w");
    let path = temp_config(&text);
    let out = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .expect("run binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = 1 + text.lines().position(|l| l == "workflow = \"w").unwrap();
    let at = format!("{}:{line}:", path.display());
    assert!(stderr.contains(&at), "{at} not in {stderr}");
}

#[test]
fn an_unknown_log_level_is_refused() {
    assert_refused(&format!("[log]\nlevel = \"inof\"\n{GOOD}"), "log.level");
}

#[test]
fn an_admin_address_in_use_stops_the_daemon_with_an_error() {
    // The port is held by this test: the daemon cannot serve /readyz and /metrics there, and
    // must say so and exit non-zero rather than run unobservable.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let text = format!("[server]\nlisten = \"{addr}\"\n{GOOD}");
    let path = temp_config(&text);
    let started = Instant::now();
    let mut child = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run binary");
    // Polled with a deadline: a daemon that ignores the failure would run for ever.
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr);
    let ok = status.is_some_and(|s| s.success());
    assert!(
        status.is_some(),
        "the daemon kept running without its admin server: {stderr}"
    );
    assert!(
        !ok,
        "the daemon exited 0 without its admin server: {stderr}"
    );
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "the error does not name the address: {stderr}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_bad_filter_fails_config_check_with_the_trigger_and_the_position() {
    let text = GOOD.replace(
        "workflow = \"w\"",
        "workflow = \"w\"\nfilter = 'value.amount > 1000.0 && headers.source = \"checkout\"'",
    );
    let path = temp_config(&text);
    let out = Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(&path)
        .output()
        .expect("run binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "config check passed: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    // `=` is not a CEL operator: the error points at it (column 41 of the expression).
    assert!(
        lines[0].contains("connections.orders.triggers.t.filter")
            && lines[0].contains("line 1, column 41"),
        "{stderr}"
    );
    // A good one passes and is printed back as written.
    let good = GOOD.replace(
        "workflow = \"w\"",
        "workflow = \"w\"\nfilter = 'value.amount > 1000.0 && headers.source == \"checkout\"'",
    );
    let out = Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(temp_config(&good))
        .output()
        .expect("run binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(r#"value.amount > 1000.0 && headers.source == \"checkout\""#)
            || stdout.contains(r#"'value.amount > 1000.0 && headers.source == "checkout"'"#),
        "{stdout}"
    );
}

#[test]
fn text_logs_written_to_a_pipe_carry_no_colour_codes() {
    // The daemon's text log goes to stderr; here that is a pipe, as in a container or a file.
    let text = format!(
        "[log]\nformat = \"text\"\n[server]\nlisten = \"127.0.0.1:{}\"\n{GOOD}",
        crate::support::free_port()
    );
    let path = temp_config(&text);
    let mut child = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run binary");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut stderr, &mut chunk) {
            if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    // Read until the admin server's line is logged (a level, a message and fields: what the
    // terminal format colours), with a deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("admin server listening") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(bytes) => seen.extend(bytes),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    let log = String::from_utf8_lossy(&seen).into_owned();
    let line = log
        .lines()
        .find(|l| l.contains("admin server listening"))
        .unwrap_or_else(|| panic!("no admin server line logged: {log}"));
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains("addr=127.0.0.1:"), "{line}");
    assert!(!seen.contains(&0x1b), "escape bytes in the log: {log:?}");
}

/// With `log.format = "json"` the daemon's last words are a JSON log line like the others
/// (level ERROR, the reason as its message, `fatal: true`), whether the configuration does
/// not load or the daemon fails once running (its admin port taken): a log pipeline parses a
/// crash-looping pod's reason. `TESSEL_KAFKA__LOG__FORMAT` decides it as it would in a
/// configuration that loads.
#[test]
fn the_fatal_message_is_a_json_log_line_when_logs_are_json() {
    let fatal_line = |stderr: &str| -> serde_json::Value {
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let last = lines.last().unwrap_or_else(|| panic!("no output"));
        let v: serde_json::Value =
            serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"));
        assert_eq!(v["level"], "ERROR", "{v}");
        assert_eq!(v["fatal"], true, "{v}");
        v
    };
    let json = "[log]\nformat = \"json\"\n";
    // A secret file that is missing: the configuration does not load.
    let unloadable = GOOD.replace(
        "\"group.id\" = \"g\"",
        "\"group.id\" = \"g\"\n\"sasl.password\" = { file = \"/nonexistent/tk-password\" }",
    );
    let (ok, stderr, _) = run_with(&format!("{json}{unloadable}"));
    assert!(!ok);
    let v = fatal_line(&stderr);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/tk-password"),
        "{v}"
    );
    // The same file with text logs: the one plain line.
    let (_, stderr, _) = run_with(&unloadable);
    assert!(stderr.starts_with("error: "), "{stderr}");
    // The environment overrides the file's format, as it does for a configuration that loads.
    let path = temp_config(&unloadable);
    let out = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .env("TESSEL_KAFKA__LOG__FORMAT", "json")
        .output()
        .expect("run binary");
    fatal_line(&String::from_utf8_lossy(&out.stderr));

    // The admin port taken: the daemon started with the JSON log, and ends in it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let (ok, stderr, _) = run_with(&format!("{json}[server]\nlisten = \"{addr}\"\n{GOOD}"));
    assert!(!ok);
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let _: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
    let v = fatal_line(&stderr);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("cannot listen on {addr}")),
        "{v}"
    );
}

/// The offsets tools name an OS error once: `cannot read config file …: No such file or
/// directory (os error 2)`, not the same cause twice.
#[test]
fn offsets_commands_name_the_os_error_once() {
    for args in [
        &["offsets", "show"][..],
        &["offsets", "reset", "--to", "earliest"][..],
    ] {
        let out = Command::new(binary())
            .args(args)
            .args(["--config", "/nonexistent/tessel-kafka.toml"])
            .output()
            .expect("run binary");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.matches("(os error 2)").count(),
            1,
            "{args:?}: {stderr}"
        );
        assert_eq!(
            stderr.trim(),
            "error: cannot read config file /nonexistent/tessel-kafka.toml: No such file or directory (os error 2)",
            "{args:?}"
        );
    }
}
