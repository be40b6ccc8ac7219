//! Security against the real broker's SASL_SSL (SCRAM-SHA-512) and SSL (mTLS) listeners with
//! ACLs enforced: a fresh SCRAM user per test holding exactly the product page's ACLs
//! (READ and DESCRIBE on the consumed topic, READ on the group, WRITE on produced topics),
//! `tessel-kafka check` naming each missing one, the daemon reporting the same words in
//! `/health`, mTLS, a wrong password without a retry storm, and no secret in any output.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{
    committed, create_topic, dispatcher, high_watermarks, produce_keyed, sasl_ssl_kafka_table,
    spawn_daemon, wait_committed_to_end, Connector,
};
use crate::support::{free_port, repo, stack, temp_config, unique, wait_for, wait_for_async};

/// A SCRAM-SHA-512 user created for one test.
pub struct Principal {
    pub user: String,
    pub password: String,
}

async fn admin_helper(args: &[&str], env: Option<(&str, &str)>) {
    let s = stack();
    let mut cmd = tokio::process::Command::new(&s.python);
    let _ = cmd
        .arg(repo().join("scripts/stack.d/kafka_admin.py"))
        .args(args)
        .args([
            "--bootstrap",
            &s.bootstrap_sasl_plaintext,
            "--admin",
            &s.admin_user,
            "--password",
            &s.admin_password,
        ]);
    if let Some((k, v)) = env {
        let _ = cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("kafka_admin.py timed out")
        .expect("run kafka_admin.py");
    assert!(
        out.status.success(),
        "kafka_admin.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub async fn scram_user(prefix: &str) -> Principal {
    let user = unique(prefix);
    let password = format!("pw-{}", unique("secret"));
    admin_helper(
        &[
            "scram-user",
            "--user",
            &user,
            "--user-password-env",
            "TESSEL_IT_NEW_USER_PASSWORD",
        ],
        Some(("TESSEL_IT_NEW_USER_PASSWORD", &password)),
    )
    .await;
    Principal { user, password }
}

/// Adds (or removes) ACLs `kind:name:OP` for `p`.
pub async fn acl(p: &Principal, add: bool, specs: &[String]) {
    let mut args = vec![
        "acl",
        "--principal",
        &p.user,
        if add { "--add" } else { "--remove" },
    ];
    args.extend(specs.iter().map(String::as_str));
    admin_helper(&args, None).await;
}

/// The product page's consumer ACLs for `topic` and `group`.
pub fn consumer_acls(topic: &str, group: &str) -> Vec<String> {
    vec![
        format!("topic:{topic}:READ"),
        format!("topic:{topic}:DESCRIBE"),
        format!("group:{group}:READ"),
    ]
}

/// Runs `tessel-kafka check` (table, or JSON); returns success and stdout + stderr.
pub(super) async fn check(config: &Path, json: bool) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(crate::support::binary());
    let _ = cmd
        .args(["check", "--config"])
        .arg(config)
        .env_remove("RUST_LOG");
    if json {
        let _ = cmd.arg("--json");
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("check finishes")
        .expect("run check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The names of the checks in `check --json` output.
pub(super) fn check_names(out: &str) -> Vec<String> {
    let json: Value =
        serde_json::from_str(out).unwrap_or_else(|e| panic!("check --json: {e}\n{out}"));
    json.as_array()
        .expect("an array of checks")
        .iter()
        .map(|l| l["check"].as_str().expect("check name").to_owned())
        .collect()
}

/// `tessel-kafka config check` output.
fn config_check(config: &Path) -> String {
    let out = std::process::Command::new(crate::support::binary())
        .args(["config", "check", "--config"])
        .arg(config)
        .output()
        .expect("config check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every password the suite uses.
fn suite_secrets(extra: &[&str]) -> Vec<String> {
    let s = stack();
    let mut v = vec![s.admin_password.clone(), s.limited_password.clone()];
    v.extend(extra.iter().map(|x| (*x).to_owned()));
    v
}

fn assert_no_secret(what: &str, text: &str, secrets: &[String]) {
    for secret in secrets {
        assert!(
            !text.contains(secret.as_str()),
            "{what} contains a secret ({} chars):\n{text}",
            secret.len()
        );
    }
}

/// The check line for `check` (its name), as (status, detail).
fn line<'a>(table: &'a str, check: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.contains(&format!(" {check} ")))
        .unwrap_or_else(|| panic!("no line `{check}` in:\n{table}"))
}

fn config_text(
    p: &Principal,
    group: &str,
    topic: &str,
    dispatcher_url: &str,
    listen_port: u16,
    trigger_extra: &str,
) -> String {
    // Passwords come from the environment-free inline form here on purpose: the file is the
    // only place they are written, and no output may repeat them.
    format!(
        r#"
[server]
listen = "127.0.0.1:{listen_port}"
[log]
level = "debug,librdkafka=debug"
[connections.it]
stall_after_ms = 2000
{kafka}[connections.it.schema_registry]
url = "{registry}"
[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf"
dispatcher = {{ url = "{dispatcher_url}", timeout_ms = 5000 }}
retry = {{ initial_backoff_ms = 100, max_backoff_ms = 1000 }}
{trigger_extra}
"#,
        kafka = sasl_ssl_kafka_table(&p.user, &p.password, group),
        registry = stack().registry_url,
    )
}

async fn health(port: u16) -> Option<Value> {
    let resp = reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .ok()?;
    resp.json::<Value>().await.ok()
}

#[tokio::test]
async fn consumes_over_sasl_ssl_with_exactly_the_product_page_acls_and_produces_once_write_is_added(
) {
    let topic = unique("sec-orders");
    let dlq = unique("sec-orders-dlq");
    let group = unique("tessel-sec");
    // One partition: the test waits for commits at the end of every partition, and an empty
    // partition is never committed.
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let p = scram_user("tessel-sec").await;
    acl(&p, true, &consumer_acls(&topic, &group)).await;
    let secrets = suite_secrets(&[&p.password]);

    // Consume and dispatch with exactly READ+DESCRIBE on the topic and READ on the group.
    let d = dispatcher(Faults::default()).await;
    let config = config_text(&p, &group, &topic, &d.url(), free_port(), "");
    let path = temp_config(&config);
    let started = Instant::now();
    let (ok, out) = check(&path, false).await;
    eprintln!("check took {:?}\n{out}", started.elapsed());
    assert!(ok, "check fails with the product page's ACLs:\n{out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(line(&out, "schema registry").contains("PASS"), "{out}");
    assert!(
        line(&out, "authentication").contains("SASL_SSL SCRAM-SHA-512"),
        "{out}"
    );
    assert!(
        !out.contains("WRITE on topic"),
        "a consumer-only connection is not probed for WRITE:\n{out}"
    );
    assert_no_secret("check output", &out, &secrets);
    assert_no_secret("config check output", &config_check(&path), &secrets);

    produce_keyed(&topic, 0, 10, 3).await;
    let (mut daemon, log) = start_daemon(&path);
    wait_for("10 runs over SASL_SSL", Duration::from_secs(60), || {
        (d.runs().len() >= 10).then_some(())
    })
    .await;
    let ends = wait_committed_to_end(&group, &topic, 1).await;
    assert_eq!(ends.iter().sum::<i64>(), 10);
    stop_daemon(&mut daemon);
    assert_no_secret(
        "daemon log",
        &std::fs::read_to_string(&log).unwrap(),
        &secrets,
    );

    // Dead-lettering produces: without WRITE, check names it; with WRITE it works.
    let failing = dispatcher(Faults {
        fail_all: Some(422),
        ..Faults::default()
    })
    .await;
    let group2 = unique("tessel-sec-dl");
    acl(&p, true, &[format!("group:{group2}:READ")]).await;
    let dl = format!("on_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"");
    let config = config_text(&p, &group2, &topic, &failing.url(), free_port(), &dl);
    let path = temp_config(&config);
    let (ok, out) = check(&path, false).await;
    assert!(!ok, "check passes without WRITE:\n{out}");
    let write = line(&out, &format!("WRITE on topic {dlq}"));
    assert!(
        write.contains("FAIL") && write.contains(&format!("missing WRITE on topic {dlq}")),
        "{out}"
    );
    assert_eq!(
        out.matches("FAIL").count(),
        2,
        "only WRITE (and the producer id it allows) fail:\n{out}"
    );
    assert_eq!(
        high_watermarks(&dlq, 1),
        vec![0],
        "the WRITE probe wrote nothing"
    );

    // The daemon without WRITE: reported with the same words, nothing committed.
    let port = free_port();
    let no_write = config_text(&p, &group2, &topic, &failing.url(), port, &dl);
    let (mut daemon, log) = start_daemon(&temp_config(&no_write));
    let body = wait_reported(port, &format!("WRITE on topic {dlq}"), &log).await;
    assert_no_secret("/health", &body.to_string(), &secrets);
    assert_nothing_passed(&group2, &topic);
    assert_eq!(high_watermarks(&dlq, 1), vec![0]);

    // WRITE added while the daemon runs: it dead-letters without a restart (its producer,
    // refused a producer id, is replaced), and only then commits.
    acl(&p, true, &[format!("topic:{dlq}:WRITE")]).await;
    let granted = Instant::now();
    wait_for_async("10 dead-lettered records", Duration::from_secs(90), || {
        let dlq = dlq.clone();
        async move { (high_watermarks(&dlq, 1) == vec![10]).then_some(()) }
    })
    .await;
    eprintln!(
        "dead-lettering resumed {:?} after WRITE was granted",
        granted.elapsed()
    );
    let ends = wait_committed_to_end(&group2, &topic, 1).await;
    assert_eq!(ends.iter().sum::<i64>(), 10);
    stop_daemon(&mut daemon);
    assert_no_secret(
        "daemon log",
        &std::fs::read_to_string(&log).unwrap(),
        &secrets,
    );

    let (ok, out) = check(&path, true).await;
    assert!(ok, "check fails with WRITE added:\n{out}");
    let names = check_names(&out);
    assert!(
        names.contains(&format!("WRITE on topic {dlq}")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "idempotent producer id"),
        "{names:?}"
    );
    assert_eq!(
        high_watermarks(&dlq, 1),
        vec![10],
        "the WRITE probe wrote nothing"
    );
    assert_no_secret("check --json output", &out, &secrets);
}

/// A daemon subprocess, killed when dropped (also when the test fails).
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the daemon with its log in a file.
fn start_daemon(config: &Path) -> (Daemon, std::path::PathBuf) {
    let log = std::env::temp_dir().join(format!("{}.log", unique("sec-daemon")));
    eprintln!("daemon log: {}", log.display());
    let daemon = spawn_daemon(config, std::fs::File::create(&log).unwrap().into());
    (Daemon(daemon), log)
}

/// SIGTERM and wait: an orderly stop.
fn stop_daemon(daemon: &mut Daemon) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &daemon.0.id().to_string()])
        .status();
    let _ = daemon.0.wait();
}

/// No message of `topic` (one partition) was passed over: the group has no committed offset,
/// or offset 0 (the connector may commit the start position, which skips nothing).
fn assert_nothing_passed(group: &str, topic: &str) {
    let c = committed(group, topic, 1);
    assert!(
        c[0] <= 0,
        "group {group} committed past unhandled messages: {c:?}"
    );
}

/// Runs the daemon with `config` until `/health` names `wanted` in `missing_permissions`;
/// returns the `/health` body and the daemon's log.
async fn daemon_reports(config: &str, port: u16, wanted: &str) -> (Value, String) {
    let (daemon, log) = start_daemon(&temp_config(config));
    let body = wait_reported(port, wanted, &log).await;
    let text = std::fs::read_to_string(&log).unwrap();
    drop(daemon);
    (body, text)
}

/// Waits until `/health` names `wanted` in `missing_permissions` and the log says `missing
/// <wanted>`; returns the `/health` body. Fails on a secret in the log.
async fn wait_reported(port: u16, wanted: &str, log: &Path) -> Value {
    let started = Instant::now();
    let body = wait_for_async(
        &format!("/health naming {wanted}"),
        Duration::from_secs(90),
        || async {
            let body = health(port).await?;
            let missing = body["connections"]["it"]["missing_permissions"].as_array()?;
            missing
                .iter()
                .any(|m| m.as_str() == Some(wanted))
                .then_some(body)
        },
    )
    .await;
    eprintln!("/health named {wanted} after {:?}", started.elapsed());
    assert_eq!(body["status"], "degraded", "{body}");
    let text = wait_for(
        "the log line with the same words",
        Duration::from_secs(30),
        || {
            let text = std::fs::read_to_string(log).ok()?;
            text.lines()
                .any(|l| l.contains(&format!("missing {wanted}")))
                .then_some(text)
        },
    )
    .await;
    assert_no_secret("daemon log", &text, &suite_secrets(&[]));
    body
}

async fn missing_acl_is_named(removed: usize, wanted_of: impl Fn(&str, &str) -> String) {
    let topic = unique("sec-missing");
    let group = unique("tessel-sec-missing");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 3, 3).await;
    let p = scram_user("tessel-sec-missing").await;
    let mut acls = consumer_acls(&topic, &group);
    let _ = acls.remove(removed);
    acl(&p, true, &acls).await;
    let wanted = wanted_of(&topic, &group);
    let secrets = suite_secrets(&[&p.password]);

    let d = dispatcher(Faults::default()).await;
    let port = free_port();
    let config = config_text(&p, &group, &topic, &d.url(), port, "");
    let (ok, out) = check(&temp_config(&config), false).await;
    assert!(!ok, "check passes without {wanted}:\n{out}");
    let l = line(&out, &wanted);
    assert!(
        l.contains("FAIL") && l.contains(&format!("missing {wanted}")),
        "{out}"
    );
    assert_no_secret("check output", &out, &secrets);

    let (body, log) = daemon_reports(&config, port, &wanted).await;
    assert_no_secret("daemon log", &log, &secrets);
    assert_no_secret("/health", &body.to_string(), &secrets);
    assert!(d.runs().is_empty(), "nothing may be dispatched");
    assert_nothing_passed(&group, &topic);
}

#[tokio::test]
async fn missing_read_on_the_topic_is_named_by_check_and_health() {
    missing_acl_is_named(0, |topic, _| format!("READ on topic {topic}")).await;
}

#[tokio::test]
async fn missing_read_on_the_group_is_named_by_check_and_health() {
    missing_acl_is_named(2, |_, group| format!("READ on group {group}")).await;
}

/// Kafka treats READ as implying DESCRIBE: without the DESCRIBE ACL nothing is missing, and
/// check says so rather than inventing a failure.
#[tokio::test]
async fn describe_is_implied_by_read() {
    let topic = unique("sec-describe");
    let group = unique("tessel-sec-describe");
    create_topic(&topic, 1).await;
    let p = scram_user("tessel-sec-describe").await;
    let mut acls = consumer_acls(&topic, &group);
    let _ = acls.remove(1);
    acl(&p, true, &acls).await;
    let d = dispatcher(Faults::default()).await;
    let config = config_text(&p, &group, &topic, &d.url(), free_port(), "");
    let (ok, out) = check(&temp_config(&config), false).await;
    assert!(ok, "{out}");
    assert!(
        line(&out, &format!("DESCRIBE on topic {topic}")).contains("PASS"),
        "{out}"
    );

    // Without READ as well, DESCRIBE is what is missing first, for check and the daemon.
    acl(&p, false, &[format!("topic:{topic}:READ")]).await;
    let (ok, out) = check(&temp_config(&config), false).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("missing DESCRIBE on topic {topic}")),
        "{out}"
    );
    let port = free_port();
    let config = config_text(&p, &group, &topic, &d.url(), port, "");
    let (_, log) = daemon_reports(&config, port, &format!("DESCRIBE on topic {topic}")).await;
    assert_no_secret("daemon log", &log, &suite_secrets(&[&p.password]));
    assert!(d.runs().is_empty());
    assert_nothing_passed(&group, &topic);
}

fn ssl_config(topic: &str, group: &str, ca: &str, dispatcher_url: &str) -> String {
    let s = stack();
    format!(
        r#"
[connections.it.kafka]
"bootstrap.servers" = "{}"
"security.protocol" = "SSL"
"ssl.ca.location" = "{ca}"
"ssl.certificate.location" = "{}"
"ssl.key.location" = "{}"
"group.id" = "{group}"
[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf"
dispatcher = {{ url = "{dispatcher_url}" }}
"#,
        s.bootstrap_ssl, s.client_cert_pem, s.client_key_pem
    )
}

#[tokio::test]
async fn mtls_client_certificate_connects_and_a_wrong_ca_fails_with_a_tls_error() {
    let s = stack();
    // The stack's client certificate is CN=alice, whose ACLs cover the prefix.
    let topic = unique(&format!("{}mtls", s.acl_prefix));
    let group = unique(&format!("{}mtls-group", s.acl_prefix));
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 3, 3).await;
    let d = dispatcher(Faults::default()).await;
    let config = ssl_config(&topic, &group, &s.ca_pem, &d.url());
    let (ok, out) = check(&temp_config(&config), false).await;
    assert!(ok, "{out}");
    assert!(line(&out, "authentication").contains("mTLS"), "{out}");

    let connector = Connector::start(&config);
    wait_for("3 runs over mTLS", Duration::from_secs(60), || {
        (d.runs().len() >= 3).then_some(())
    })
    .await;
    let _ = wait_committed_to_end(&group, &topic, 1).await;
    connector.stop().await;

    let wrong = ssl_config(&topic, &group, &s.wrong_ca_pem, &d.url());
    let (ok, out) = check(&temp_config(&wrong), false).await;
    assert!(!ok, "{out}");
    let auth = line(&out, "authentication");
    assert!(
        auth.contains("FAIL") && auth.contains("TLS handshake failed"),
        "{out}"
    );
    assert!(auth.contains("certificate verify failed"), "{out}");
}

/// A TCP proxy in front of `target` that counts the connections it accepts.
async fn counting_proxy(target: String) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&count);
    drop(tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let _ = counter.fetch_add(1, Ordering::SeqCst);
            let target = target.clone();
            drop(tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            }));
        }
    }));
    (port, count)
}

#[tokio::test]
async fn wrong_password_is_a_clear_authentication_error_without_a_retry_storm() {
    let topic = unique("sec-wrongpw");
    let group = unique("tessel-sec-wrongpw");
    create_topic(&topic, 1).await;
    let p = scram_user("tessel-sec-wrongpw").await;
    acl(&p, true, &consumer_acls(&topic, &group)).await;
    let wrong = Principal {
        user: p.user.clone(),
        password: format!("{}-wrong", p.password),
    };
    let secrets = suite_secrets(&[&p.password, &wrong.password]);
    let d = dispatcher(Faults::default()).await;
    let (proxy, connections) = counting_proxy(stack().bootstrap_sasl_ssl.clone()).await;
    let port = free_port();
    let config = config_text(&wrong, &group, &topic, &d.url(), port, "").replace(
        &format!("\"{}\"", stack().bootstrap_sasl_ssl),
        &format!("\"127.0.0.1:{proxy}\""),
    );

    let path = temp_config(&config);
    let (ok, out) = check(&path, false).await;
    assert!(!ok, "{out}");
    let auth = line(&out, "authentication");
    assert!(
        auth.contains("FAIL") && auth.contains("authentication failed"),
        "{out}"
    );
    assert_no_secret("check output", &out, &secrets);

    let (daemon, log) = start_daemon(&path);
    let body = wait_for_async(
        "/health reporting the authentication failure",
        Duration::from_secs(60),
        || async {
            let body = health(port).await?;
            let e = body["connections"]["it"]["kafka_error"].as_str()?;
            e.contains("authentication failed").then_some(body)
        },
    )
    .await;
    assert_eq!(body["status"], "degraded");
    // Measure reconnect attempts over a fixed window once the failure is established.
    let before = connections.load(Ordering::SeqCst);
    let window = Duration::from_secs(30);
    tokio::time::sleep(window).await;
    let attempts = connections.load(Ordering::SeqCst) - before;
    eprintln!("wrong password: {attempts} connection attempts in {window:?}");
    drop(daemon);
    // librdkafka backs off exponentially up to reconnect.backoff.max.ms (10 s): a storm would
    // be hundreds.
    assert!(
        attempts <= 20,
        "{attempts} connection attempts in {window:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("authentication failed") || text.contains("Authentication failed"),
        "{text}"
    );
    assert_no_secret("daemon log", &text, &secrets);
    assert_no_secret("/health", &body.to_string(), &secrets);
    assert_no_secret("config check output", &config_check(&path), &secrets);
    assert!(d.runs().is_empty());
}

/// The registry client takes the stack's CA and client certificate (PEM) for a custom CA
/// and mTLS. (The stack's registry speaks plain HTTP, so no TLS handshake happens here.)
#[test]
fn registry_client_loads_a_custom_ca_and_client_certificate() {
    let s = stack();
    let text = format!(
        r#"
[connections.c.kafka]
"bootstrap.servers" = "127.0.0.1:1"
"group.id" = "g"
[connections.c.schema_registry]
url = "https://registry.example"
ca_location = "{}"
certificate_location = "{}"
key_location = "{}"
[connections.c.triggers.t]
topics = ["x"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:1/" }}
"#,
        s.ca_pem, s.client_cert_pem, s.client_key_pem
    );
    let config = tessel_kafka::config::Config::from_toml_with_env(&text, Vec::new()).unwrap();
    let registry = config.connections["c"].schema_registry.as_ref().unwrap();
    tessel_kafka::codec::registry::RegistryClient::try_new(registry)
        .expect("CA and client certificate load");
}
