//! Many tenants in one daemon (issue 28): a connection that cannot start, authenticate or
//! reach its registry is reported and retried while the others run, and a configuration
//! reload applies only what changed: untouched connections keep their consumer (member id) and
//! keep dispatching, an invalid configuration is refused with everything left running.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::ClientConfig;
use serde_json::Value;
use tessel_kafka::cli::dev_dispatcher::DevDispatcher;

use super::{create_topic, dispatcher, produce_keyed, spawn_daemon};
use crate::support::{free_port, stack, unique, wait_for, wait_for_async};

/// The text of `url`, when it answers.
async fn get_text(url: &str) -> Option<String> {
    reqwest::get(url).await.ok()?.text().await.ok()
}

/// The value of the first sample of `name` whose labels contain `labels`.
fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Runs accepted per connection.
fn runs_by_connection(d: &DevDispatcher) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in d.runs() {
        let c = r.event["connection"].as_str().unwrap_or("?").to_owned();
        *out.entry(c).or_default() += 1;
    }
    out
}

/// The member ids of `group`, sorted.
fn member_ids(admin: &BaseConsumer, group: &str) -> Vec<String> {
    let Ok(list) = admin.fetch_group_list(Some(group), Duration::from_secs(5)) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = list
        .groups()
        .iter()
        .filter(|g| g.name() == group)
        .flat_map(|g| g.members().iter().map(|m| m.id().to_owned()))
        .collect();
    ids.sort();
    ids
}

/// Asks the daemon at `base` to reload its configuration.
async fn reload(base: &str) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/-/reload"))
        .send()
        .await
        .expect("POST /-/reload");
    assert_eq!(resp.status(), 202);
}

/// Writes the configuration at `path` as an orchestrator does: a new file renamed over the
/// old one.
fn write_config(path: &std::path::Path, text: &str) {
    let name = path.file_name().unwrap().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.new"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// SIGTERM, then the daemon must exit 0; its log.
fn stop(daemon: &mut std::process::Child, log: &std::path::Path) -> String {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = daemon.wait().unwrap();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(exit.success(), "exit {exit:?}: {text}");
    text
}

struct Tenant {
    name: &'static str,
    topic: String,
    group: String,
}

impl Tenant {
    /// A tenant whose topic and group start with `prefix` (the limited principal's ACLs).
    fn new(name: &'static str, prefix: &str) -> Self {
        Self {
            name,
            topic: unique(&format!("{prefix}region-{name}")),
            group: unique(&format!("{prefix}region-{name}-g")),
        }
    }

    /// The connection's TOML, with `kafka` lines for its security.
    fn toml(&self, kafka: &str, dispatcher: &str) -> String {
        format!(
            r#"
[connections.{name}]
drain_timeout_ms = 5000
[connections.{name}.kafka]
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
{kafka}
[connections.{name}.triggers.main]
topics = ["{topic}"]
workflow = "wf-{name}"
key_format = "string"
dispatcher = {{ url = "{dispatcher}" }}
"#,
            name = self.name,
            group = self.group,
            topic = self.topic,
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_tenant_is_retried_while_the_others_run_and_a_reload_applies_only_changes() {
    let s = stack();
    let good = [Tenant::new("good-a", ""), Tenant::new("good-b", "")];
    // Over mTLS, as the limited principal of the stack (its ACLs cover this prefix).
    let bad_ca = Tenant::new("bad-ca", &s.acl_prefix);
    let bad_pw = Tenant::new("bad-pw", "");
    for t in good.iter().chain([&bad_ca, &bad_pw]) {
        create_topic(&t.topic, 2).await;
        produce_keyed(&t.topic, 0, 20, 5).await;
    }
    // Its records are Avro in the registry's wire format; its registry is unreachable.
    let bad_reg = Tenant::new("bad-reg", "");
    create_topic(&bad_reg.topic, 2).await;
    let orders: Vec<Value> = (0..20)
        .map(|i| {
            serde_json::json!({"key": format!("k{}", i % 5),
                "value": {"order_id": format!("o-{i}"), "amount": 1.5 * i as f64, "tags": ["a"]}})
        })
        .collect();
    let _ = super::reference_produce(serde_json::json!({
        "bootstrap": s.bootstrap, "registry": s.registry_url, "topic": bad_reg.topic,
        "key": {"format": "string"}, "value": {"format": "avro", "schema": super::triggers::ORDER_AVRO},
        "steps": [{"txn": null, "records": orders}]
    }))
    .await;
    let dead_registry = format!("http://127.0.0.1:{}", free_port());
    let d = dispatcher(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("sasl-password");
    std::fs::write(&password_file, "not-the-password\n").unwrap();
    let admin_port = free_port();
    let plaintext = format!("\"bootstrap.servers\" = \"{}\"", s.bootstrap);
    let sasl = format!(
        "\"bootstrap.servers\" = \"{}\"\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\"sasl.username\" = \"{}\"\n\"sasl.password_file\" = \"{}\"\n\"ssl.ca.location\" = \"{}\"",
        s.bootstrap_sasl_ssl,
        s.admin_user,
        password_file.display(),
        s.ca_pem
    );
    let ssl = |ca: &str| {
        format!(
            "\"bootstrap.servers\" = \"{}\"\n\"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = \"{ca}\"\n\"ssl.certificate.location\" = \"{}\"\n\"ssl.key.location\" = \"{}\"",
            s.bootstrap_ssl, s.client_cert_pem, s.client_key_pem
        )
    };
    let config = |ca: &str, registry: &str, extra: &str| {
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:{admin_port}\"\nreload_endpoint = true\n{extra}"
        );
        for t in &good {
            text.push_str(&t.toml(&plaintext, &d.url()));
        }
        text.push_str(&bad_ca.toml(&ssl(ca), &d.url()));
        text.push_str(&bad_pw.toml(&sasl, &d.url()));
        text.push_str(&bad_reg.toml(&plaintext, &d.url()));
        text.push_str(&format!(
            "[connections.bad-reg.schema_registry]\nurl = \"{registry}\"\n"
        ));
        text
    };
    let path = dir.path().join("config.toml");
    let write = |text: String| write_config(&path, &text);
    let missing_ca = dir.path().join("no-such-ca.pem");
    write(config(
        &missing_ca.display().to_string(),
        &dead_registry,
        "",
    ));
    let log = std::env::temp_dir().join(format!("{}.log", unique("region")));
    let mut daemon = spawn_daemon(&path, std::fs::File::create(&log).unwrap().into());
    let base = format!("http://127.0.0.1:{admin_port}");
    let reload = || reload(&base);

    // The good tenants drain their topics while the other two cannot run.
    wait_for("the good tenants' runs", Duration::from_secs(60), || {
        let runs = runs_by_connection(&d);
        (runs.get("good-a") == Some(&20) && runs.get("good-b") == Some(&20)).then_some(())
    })
    .await;
    let (metrics, health) = wait_for_async(
        "the failing tenants reported",
        Duration::from_secs(60),
        || async {
            let metrics = get_text(&format!("{base}/metrics")).await?;
            let health: Value =
                serde_json::from_str(&get_text(&format!("{base}/health")).await?).ok()?;
            let reported = sample(
                &metrics,
                "tessel_kafka_connection_up",
                "connection=\"bad-ca\"",
            ) == Some(0.0)
                && sample(
                    &metrics,
                    "tessel_kafka_connection_failures_total",
                    "connection=\"bad-ca\"",
                )
                .is_some_and(|n| n >= 1.0)
                && health["connections"]["bad-pw"]["kafka_error"].is_string()
                && health["connections"]["bad-reg"]["registry_reachable"] == false
                && sample(
                    &metrics,
                    "tessel_kafka_registry_errors_total",
                    "connection=\"bad-reg\"",
                )
                .is_some_and(|n| n >= 1.0);
            reported.then_some((metrics, health))
        },
    )
    .await;
    assert_eq!(
        sample(
            &metrics,
            "tessel_kafka_connection_up",
            "connection=\"good-a\""
        ),
        Some(1.0)
    );
    let start_error = health["connections"]["bad-ca"]["start_error"]
        .as_str()
        .unwrap_or_default();
    assert!(start_error.contains("ssl.ca.location"), "{health}");
    // One tenant's trouble never makes the daemon unready.
    let ready = reqwest::get(format!("{base}/readyz"))
        .await
        .unwrap()
        .status();
    assert_eq!(ready, 200);
    assert!(!runs_by_connection(&d).contains_key("bad-ca"));
    assert!(!runs_by_connection(&d).contains_key("bad-pw"));
    assert!(!runs_by_connection(&d).contains_key("bad-reg"));
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon runs on");

    let admin: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.bootstrap)
        .create()
        .unwrap();
    let members_before: Vec<Vec<String>> =
        good.iter().map(|t| member_ids(&admin, &t.group)).collect();
    assert!(
        members_before.iter().all(|m| m.len() == 1),
        "{members_before:?}"
    );

    // The CA path, the password file and the registry are fixed; a reload restarts the three,
    // only them.
    std::fs::write(&password_file, format!("{}\n", s.admin_password)).unwrap();
    write(config(&s.ca_pem, &s.registry_url, ""));
    reload().await;
    wait_for("the fixed tenants' runs", Duration::from_secs(90), || {
        let runs = runs_by_connection(&d);
        (runs.get("bad-ca") == Some(&20)
            && runs.get("bad-pw") == Some(&20)
            && runs.get("bad-reg") == Some(&20))
        .then_some(())
    })
    .await;
    produce_keyed(&good[0].topic, 20, 30, 5).await;
    wait_for(
        "the untouched tenant keeps dispatching",
        Duration::from_secs(30),
        || (runs_by_connection(&d).get("good-a") == Some(&30)).then_some(()),
    )
    .await;
    let members_after: Vec<Vec<String>> =
        good.iter().map(|t| member_ids(&admin, &t.group)).collect();
    assert_eq!(
        members_before, members_after,
        "untouched consumers keep their member ids"
    );

    // An invalid configuration is refused: everything keeps running.
    write(config(&s.ca_pem, &s.registry_url, "this is not toml"));
    reload().await;
    let metrics = wait_for_async(
        "the refused reload counted",
        Duration::from_secs(30),
        || async {
            let metrics = get_text(&format!("{base}/metrics")).await?;
            sample(
                &metrics,
                "tessel_kafka_config_reloads_total",
                "result=\"invalid\"",
            )
            .is_some_and(|n| n >= 1.0)
            .then_some(metrics)
        },
    )
    .await;
    assert!(
        sample(
            &metrics,
            "tessel_kafka_config_reloads_total",
            "result=\"ok\""
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    produce_keyed(&good[1].topic, 20, 30, 5).await;
    produce_keyed(&bad_ca.topic, 20, 30, 5).await;
    wait_for(
        "still dispatching after the refused reload",
        Duration::from_secs(30),
        || {
            let runs = runs_by_connection(&d);
            (runs.get("good-b") == Some(&30) && runs.get("bad-ca") == Some(&30)).then_some(())
        },
    )
    .await;
    assert_eq!(
        good.iter()
            .map(|t| member_ids(&admin, &t.group))
            .collect::<Vec<_>>(),
        members_before
    );
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());

    let text = stop(&mut daemon, &log);
    assert!(text.contains("configuration reload refused"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("bad-reg") && l.contains("schema registry unavailable")),
        "the unreachable registry named in the log: {text}"
    );
}

/// The offsets of `connection`'s accepted runs, per partition of a 2-partition topic.
fn accepted_offsets(d: &DevDispatcher, connection: &str) -> [Vec<i64>; 2] {
    let mut out = [Vec::new(), Vec::new()];
    for r in d.runs() {
        if r.event["connection"] == connection {
            let p = r.event["partition"].as_i64().expect("partition") as usize;
            out[p].push(r.event["offset"].as_i64().expect("offset"));
        }
    }
    out
}

/// Issue 28: of 20 running connections, a reload changes one trigger's concurrency, adds a
/// connection and removes one. The untouched 18 keep their consumers (member ids), see no
/// rebalance and keep dispatching; the changed one restarts and dispatches on; the removed one
/// commits exactly what it accepted before it stops; the added one drains its topic.
#[tokio::test(flavor = "multi_thread")]
async fn of_twenty_connections_a_reload_restarts_the_changed_stops_the_removed_and_starts_the_added(
) {
    let s = stack();
    let names: Vec<&'static str> = (0..21)
        .map(|i| &*Box::leak(format!("t{i:02}").into_boxed_str()))
        .collect();
    let tenants: Vec<Tenant> = names.iter().map(|n| Tenant::new(n, "")).collect();
    for t in &tenants {
        create_topic(&t.topic, 2).await;
    }
    futures::future::join_all(tenants.iter().map(|t| produce_keyed(&t.topic, 0, 20, 5))).await;
    let d = dispatcher(Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let plaintext = format!("\"bootstrap.servers\" = \"{}\"", s.bootstrap);
    // Tenants `running` in the configuration; t00's trigger with `concurrency`.
    let config = |running: &[&Tenant], concurrency: usize| {
        let mut text =
            format!("[server]\nlisten = \"127.0.0.1:{admin_port}\"\nreload_endpoint = true\n");
        for t in running {
            let mut toml = t.toml(&plaintext, &d.url());
            if t.name == "t00" {
                toml.push_str(&format!("concurrency = {concurrency}\n"));
            }
            text.push_str(&toml);
        }
        text
    };
    let path = dir.path().join("config.toml");
    let write = |text: String| write_config(&path, &text);
    let (first, added) = tenants.split_at(20);
    let (added, removed, changed) = (&added[0], &first[19], &first[0]);
    let untouched = &first[1..19];
    write(config(&first.iter().collect::<Vec<_>>(), 8));
    let log = std::env::temp_dir().join(format!("{}.log", unique("region-reload")));
    let mut daemon = spawn_daemon(&path, std::fs::File::create(&log).unwrap().into());
    let base = format!("http://127.0.0.1:{admin_port}");

    wait_for(
        "every tenant's first 20 runs",
        Duration::from_secs(90),
        || {
            let runs = runs_by_connection(&d);
            first
                .iter()
                .all(|t| runs.get(t.name) == Some(&20))
                .then_some(())
        },
    )
    .await;
    let admin: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.bootstrap)
        .create()
        .unwrap();
    let members = |ts: &[Tenant]| -> Vec<Vec<String>> {
        ts.iter().map(|t| member_ids(&admin, &t.group)).collect()
    };
    let before = members(untouched);
    assert!(before.iter().all(|m| m.len() == 1), "{before:?}");
    let changed_before = member_ids(&admin, &changed.group);
    // Every kind (assign, revoke, lost) together.
    let rebalances = |metrics: &str, t: &Tenant| -> f64 {
        let label = format!("connection=\"{}\"", t.name);
        metrics
            .lines()
            .filter(|l| l.starts_with("tessel_kafka_rebalances_total") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let metrics_before = get_text(&format!("{base}/metrics")).await.unwrap();

    // More records everywhere while the reload happens.
    futures::future::join_all(first.iter().map(|t| produce_keyed(&t.topic, 20, 30, 5))).await;
    let mut running: Vec<&Tenant> = first[..19].iter().collect();
    running.push(added);
    write(config(&running, 4));
    reload(&base).await;

    wait_for(
        "the untouched and changed tenants' 30 runs, the added one's 20",
        Duration::from_secs(90),
        || {
            let runs = runs_by_connection(&d);
            (first[..19].iter().all(|t| runs.get(t.name) == Some(&30))
                && runs.get(added.name) == Some(&20))
            .then_some(())
        },
    )
    .await;
    // The removed tenant left its group, having committed exactly what it accepted: in each
    // partition, up to the first offset it did not.
    wait_for(
        "the removed tenant's consumer gone",
        Duration::from_secs(60),
        || member_ids(&admin, &removed.group).is_empty().then_some(()),
    )
    .await;
    let accepted = accepted_offsets(&d, removed.name);
    let expected: Vec<i64> = accepted
        .iter()
        .map(|offsets| {
            let mut next = 0;
            while offsets.contains(&next) {
                next += 1;
            }
            next
        })
        .collect();
    let committed = super::committed(&removed.group, &removed.topic, 2);
    assert_eq!(committed, expected, "the removed tenant's last commit");
    assert!(
        expected.iter().sum::<i64>() >= 20,
        "it ran its first records"
    );

    assert_eq!(members(untouched), before, "untouched consumers kept");
    let changed_after = member_ids(&admin, &changed.group);
    assert_eq!(changed_after.len(), 1);
    assert_ne!(
        changed_after, changed_before,
        "the changed tenant restarted"
    );
    let metrics_after = get_text(&format!("{base}/metrics")).await.unwrap();
    for t in untouched {
        assert_eq!(
            rebalances(&metrics_after, t),
            rebalances(&metrics_before, t),
            "{} saw no rebalance",
            t.name
        );
    }
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());

    let _ = stop(&mut daemon, &log);
}

/// A directory laid out as the kubelet mounts a Secret: each file a link to `..data/<file>`,
/// `..data` a link to a timestamped directory that holds the files.
struct SecretMount {
    dir: tempfile::TempDir,
    version: u32,
}

impl SecretMount {
    fn new(files: &[(&str, &str)]) -> Self {
        let mut m = Self {
            dir: tempfile::tempdir().unwrap(),
            version: 0,
        };
        m.update(files);
        m
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }

    /// Swaps in new contents as the kubelet does: a new timestamped directory, a `..data_tmp`
    /// link to it renamed over `..data`, the old directory removed; links for new files.
    fn update(&mut self, files: &[(&str, &str)]) {
        use std::os::unix::fs::symlink;
        let root = self.dir.path();
        self.version += 1;
        let stamp = format!("..2026_12_06_00_00_{:02}.{}", self.version, self.version);
        std::fs::create_dir(root.join(&stamp)).unwrap();
        for (name, content) in files {
            std::fs::write(root.join(&stamp).join(name), content).unwrap();
            let link = root.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                symlink(format!("..data/{name}"), &link).unwrap();
            }
        }
        let old = std::fs::read_link(root.join("..data")).ok();
        symlink(&stamp, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(root.join(old)).unwrap();
        }
    }
}

/// Issue 36: a dispatcher token mounted from an existing Kubernetes Secret is rotated. The
/// daemon sees the mount's swap (no SIGHUP, no config change), reloads, and restarts only the
/// connection whose secret changed: the runs after the rotation carry the new token, none is
/// repeated. A rotation that leaves the file out is refused (the running configuration kept,
/// `tessel_kafka_config_last_reload_successful` 0) until the Secret is whole again.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_secret_mounted_from_a_kubernetes_secret_is_reloaded() {
    let s = stack();
    let (rotated, other) = (Tenant::new("rotated", ""), Tenant::new("other", ""));
    for t in [&rotated, &other] {
        create_topic(&t.topic, 2).await;
        produce_keyed(&t.topic, 0, 10, 5).await;
    }
    let d = dispatcher(Default::default()).await;
    let mut secret = SecretMount::new(&[("dispatcher-token", "token-one\n")]);
    let admin_port = free_port();
    let plaintext = format!("\"bootstrap.servers\" = \"{}\"", s.bootstrap);
    // The rotated tenant's dispatcher reads its token from the mount.
    let rotated_toml = rotated.toml(&plaintext, &d.url()).replace(
        &format!("url = \"{}\" }}", d.url()),
        &format!(
            "url = \"{}\", token = {{ file = \"{}\" }} }}",
            d.url(),
            secret.path("dispatcher-token").display()
        ),
    );
    assert!(rotated_toml.contains("token = { file"), "{rotated_toml}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    write_config(
        &path,
        &format!(
            "[server]\nlisten = \"127.0.0.1:{admin_port}\"\n{rotated_toml}{}",
            other.toml(&plaintext, &d.url())
        ),
    );
    let log = std::env::temp_dir().join(format!("{}.log", unique("secret-rotation")));
    let mut daemon = spawn_daemon(&path, std::fs::File::create(&log).unwrap().into());
    let base = format!("http://127.0.0.1:{admin_port}");
    let tokens = |connection: &str| -> Vec<Option<String>> {
        d.runs()
            .iter()
            .filter(|r| r.event["connection"] == connection)
            .map(|r| r.authorization.clone())
            .collect()
    };
    wait_for("both tenants' first runs", Duration::from_secs(60), || {
        let runs = runs_by_connection(&d);
        (runs.get("rotated") == Some(&10) && runs.get("other") == Some(&10)).then_some(())
    })
    .await;
    assert!(tokens("rotated")
        .iter()
        .all(|t| t.as_deref() == Some("Bearer token-one")));
    let admin: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.bootstrap)
        .create()
        .unwrap();
    let other_members = member_ids(&admin, &other.group);

    secret.update(&[("dispatcher-token", "token-two\n")]);
    let metric = |name: &'static str, labels: &'static str| {
        let base = base.clone();
        async move { sample(&get_text(&format!("{base}/metrics")).await?, name, labels) }
    };
    wait_for_async(
        "the reload the rotation asks for",
        Duration::from_secs(30),
        || async {
            (metric("tessel_kafka_config_reloads_total", "result=\"ok\"").await? >= 1.0)
                .then_some(())
        },
    )
    .await;
    produce_keyed(&rotated.topic, 10, 20, 5).await;
    produce_keyed(&other.topic, 10, 20, 5).await;
    wait_for("both tenants' later runs", Duration::from_secs(60), || {
        let runs = runs_by_connection(&d);
        (runs.get("rotated") == Some(&20) && runs.get("other") == Some(&20)).then_some(())
    })
    .await;
    let after: Vec<Option<String>> = tokens("rotated")[10..].to_vec();
    assert!(
        after
            .iter()
            .all(|t| t.as_deref() == Some("Bearer token-two")),
        "{after:?}"
    );
    assert_eq!(
        member_ids(&admin, &other.group),
        other_members,
        "the tenant whose secret did not change kept its consumer"
    );

    // A Secret without the file: refused, everything runs on, the gauge says so.
    secret.update(&[("unrelated", "x")]);
    let _ = std::fs::remove_file(secret.path("dispatcher-token"));
    wait_for_async("the refused reload", Duration::from_secs(30), || async {
        (metric("tessel_kafka_config_last_reload_successful", "").await? == 0.0).then_some(())
    })
    .await;
    assert!(
        metric("tessel_kafka_config_reloads_total", "result=\"invalid\"")
            .await
            .is_some_and(|n| n >= 1.0)
    );
    secret.update(&[("dispatcher-token", "token-three\n")]);
    wait_for_async(
        "the Secret whole again",
        Duration::from_secs(30),
        || async {
            (metric("tessel_kafka_config_last_reload_successful", "").await? == 1.0).then_some(())
        },
    )
    .await;
    produce_keyed(&rotated.topic, 20, 25, 5).await;
    wait_for("the runs after the repair", Duration::from_secs(60), || {
        (runs_by_connection(&d).get("rotated") == Some(&25)).then_some(())
    })
    .await;
    assert!(tokens("rotated")[20..]
        .iter()
        .all(|t| t.as_deref() == Some("Bearer token-three")));
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());
    let text = stop(&mut daemon, &log);
    assert!(text.contains("secret file changed"), "{text}");
}
