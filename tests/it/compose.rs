//! `docker-compose.yml` is valid to Docker Compose's own loader (compose-go, through
//! `scripts/compose-check.sh`; no Docker engine needed), it tells the same story as
//! `config/compose/tessel-kafka.toml`, `scripts/stack` and `scripts/demo`, and the check
//! rejects a broken file.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::repo;

/// Runs `scripts/compose-check.sh` with `args`; fails the test when Go is missing.
fn compose_check(args: &[&str]) -> Output {
    let go = Command::new("go").arg("version").output();
    assert!(
        go.is_ok_and(|o| o.status.success()),
        "`go` is missing: the compose check builds its validator with Go; run scripts/deps"
    );
    Command::new(repo().join("scripts/compose-check.sh"))
        .args(args)
        .output()
        .expect("run scripts/compose-check.sh")
}

/// The repository's compose project, normalized by the loader.
fn project() -> Value {
    let out = compose_check(&["--json"]);
    assert!(
        out.status.success(),
        "docker-compose.yml is invalid: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the checker prints JSON")
}

/// The connector's configuration as the compose file mounts it.
fn compose_toml() -> toml::Value {
    let text = std::fs::read_to_string(repo().join("config/compose/tessel-kafka.toml"))
        .expect("read config/compose/tessel-kafka.toml");
    toml::from_str(&text).expect("config/compose/tessel-kafka.toml is TOML")
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v:#}"))
}

fn toml_str<'a>(v: &'a toml::Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, key| v.get(key))
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| panic!("no string at {} in tessel-kafka.toml", path.join(".")))
}

/// A service's command as one string.
fn command(service: &Value) -> String {
    service["command"]
        .as_array()
        .unwrap_or_else(|| panic!("no command in {service:#}"))
        .iter()
        .map(|a| a.as_str().expect("command argument"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `--flag value` from a command line (whitespace-separated).
fn flag<'a>(command: &'a str, name: &str) -> &'a str {
    let mut words = command.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == name)
        .and_then(|_| words.next())
        .unwrap_or_else(|| panic!("{name} missing from {command:?}"))
}

/// The default of `NAME="${NAME:-default}"` in `scripts/stack`.
fn stack_default(stack: &str, name: &str) -> String {
    let prefix = format!("{name}=\"${{{name}:-");
    let line = stack
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("scripts/stack sets no default {name}"));
    line[prefix.len()..]
        .split('}')
        .next()
        .expect("default")
        .to_owned()
}

#[test]
fn compose_file_validates_and_has_every_service() {
    let project = project();
    let services: BTreeSet<&str> = project["services"]
        .as_object()
        .expect("services")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        services,
        BTreeSet::from(["connector", "dispatcher", "kafka", "producer", "registry"])
    );
    let connector = &project["services"]["connector"];
    for (dependency, condition) in [
        ("kafka", "service_healthy"),
        ("registry", "service_healthy"),
        ("dispatcher", "service_started"),
        ("producer", "service_completed_successfully"),
    ] {
        assert_eq!(
            str_at(connector, &format!("/depends_on/{dependency}/condition")),
            condition,
            "connector's depends_on {dependency}"
        );
    }
}

#[test]
fn compose_file_and_connector_config_tell_the_same_story() {
    let project = project();
    let services = &project["services"];
    let config = compose_toml();
    let demo = &config["connections"]["demo"];

    // The connector mounts config/compose/tessel-kafka.toml where the image's CMD reads it.
    let connector = &services["connector"];
    let volumes = connector["volumes"].as_array().expect("connector volumes");
    let toml_path = repo().join("config/compose/tessel-kafka.toml");
    assert!(
        volumes.iter().any(|v| v["type"] == "bind"
            && Path::new(str_at(v, "/source")) == toml_path
            && v["target"] == "/etc/tessel-kafka/config.toml"),
        "connector does not mount {} at /etc/tessel-kafka/config.toml: {volumes:#?}",
        toml_path.display()
    );
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    assert!(dockerfile.contains(r#""--config", "/etc/tessel-kafka/config.toml""#));

    // The admin server's port is the one published, and the one the image's healthcheck probes.
    let listen = toml_str(&config, &["server", "listen"]);
    let admin_port: u64 = listen.rsplit(':').next().unwrap().parse().expect("port");
    assert_eq!(connector["ports"][0]["target"], admin_port, "{listen}");
    assert!(dockerfile.contains(&format!("http://127.0.0.1:{admin_port}/healthz")));

    // `docker compose stop` waits longer than the drain before it kills the connector
    // (Docker's default is 10 s, a third of the default drain).
    let grace =
        humantime_serde::re::humantime::parse_duration(str_at(connector, "/stop_grace_period"))
            .expect("stop_grace_period is a duration");
    let loaded = tessel_kafka::config::Config::from_toml_with_env(
        &std::fs::read_to_string(repo().join("config/compose/tessel-kafka.toml")).unwrap(),
        Vec::new(),
    )
    .expect("the compose config loads");
    let drain = loaded.connections["demo"].drain_timeout_ms;
    assert!(
        grace > std::time::Duration::from_millis(drain),
        "stop_grace_period {grace:?} does not outlast drain_timeout_ms {drain}"
    );

    // Kafka: the bootstrap address is the broker service's advertised PLAINTEXT listener.
    let bootstrap = toml_str(demo, &["kafka", "bootstrap.servers"]);
    let (host, port) = bootstrap.split_once(':').expect("host:port");
    assert!(
        services.get(host).is_some(),
        "no service {host} ({bootstrap})"
    );
    let kafka_env = &services[host]["environment"];
    assert_eq!(
        str_at(kafka_env, "/KAFKA_ADVERTISED_LISTENERS"),
        format!("PLAINTEXT://{bootstrap}")
    );
    assert!(
        str_at(kafka_env, "/KAFKA_LISTENERS").contains(&format!("PLAINTEXT://:{port}")),
        "{kafka_env:#}"
    );
    assert!(
        str_at(&services[host], "/healthcheck/test/1").contains(&format!("localhost:{port}")),
        "the broker's healthcheck probes another port"
    );

    // The registry: Apicurio's Confluent-compatible API, at the port its healthcheck probes.
    let registry_url: url::Url = toml_str(demo, &["schema_registry", "url"])
        .parse()
        .expect("registry URL");
    let registry = &services[registry_url.host_str().expect("registry host")];
    assert!(str_at(registry, "/image").starts_with("apicurio/apicurio-registry:"));
    assert_eq!(registry_url.path(), "/apis/ccompat/v7");
    let probe = format!(
        "http://localhost:{}{}/",
        registry_url.port().expect("registry port"),
        registry_url.path()
    );
    assert!(
        str_at(registry, "/healthcheck/test/1").contains(&probe),
        "the registry's healthcheck does not probe {probe}"
    );

    // The dispatcher the trigger posts to is the dispatcher service, on the port it listens on.
    let orders = &demo["triggers"]["orders"];
    let dispatcher_url: url::Url = toml_str(orders, &["dispatcher", "url"])
        .parse()
        .expect("dispatcher URL");
    let dispatcher = &services[dispatcher_url.host_str().expect("dispatcher host")];
    let dispatcher_command = command(dispatcher);
    assert!(dispatcher_command.starts_with("dev-dispatcher "));
    assert_eq!(
        flag(&dispatcher_command, "--listen"),
        format!(
            "0.0.0.0:{}",
            dispatcher_url.port().expect("dispatcher port")
        )
    );

    // The producer writes to the broker, the registry and the topic the trigger reads.
    let producer = command(&services["producer"]);
    assert!(producer.contains("/scripts/demo_orders.py"), "{producer}");
    assert_eq!(flag(&producer, "--bootstrap"), bootstrap);
    assert_eq!(flag(&producer, "--registry"), registry_url.as_str());
    let topics: Vec<&str> = orders["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .map(|t| t.as_str().expect("topic"))
        .collect();
    assert_eq!(topics, [flag(&producer, "--topic")]);
}

#[test]
fn compose_file_runs_what_scripts_stack_runs() {
    let project = project();
    let services = &project["services"];
    let stack = std::fs::read_to_string(repo().join("scripts/stack")).expect("scripts/stack");

    assert_eq!(
        str_at(&services["kafka"], "/image"),
        format!("apache/kafka:{}", stack_default(&stack, "KAFKA_VERSION"))
    );
    assert_eq!(
        str_at(&services["registry"], "/image"),
        format!(
            "apicurio/apicurio-registry:{}",
            stack_default(&stack, "APICURIO_VERSION")
        )
    );
    // The registry's storage and ccompat settings, as environment variables (Quarkus maps
    // apicurio.ccompat.use-canonical-hash to APICURIO_CCOMPAT_USE_CANONICAL_HASH).
    let mut compared = 0;
    for setting in stack
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("-Dapicurio."))
    {
        let (key, value) = setting.split_once('=').expect("-Dkey=value");
        if !(key.starts_with("storage.") || key.starts_with("ccompat.")) {
            continue;
        }
        let name = format!("APICURIO_{}", key.to_uppercase().replace(['.', '-'], "_"));
        assert_eq!(
            services["registry"]["environment"][&name], value,
            "registry's {name} (scripts/stack: -Dapicurio.{key}={value})"
        );
        compared += 1;
    }
    assert!(
        compared >= 3,
        "found {compared} registry settings in scripts/stack"
    );
}

/// Writes the repository's compose file, changed by `edit`, into a temporary project dir with
/// the files it mounts, and returns the check's exit status and stderr.
fn check_edited(edit: impl FnOnce(String) -> String, with_mounted_files: bool) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let original =
        std::fs::read_to_string(repo().join("docker-compose.yml")).expect("docker-compose.yml");
    let edited = edit(original.clone());
    assert_ne!(edited, original, "the edit changed nothing");
    let file = dir.path().join("docker-compose.yml");
    std::fs::write(&file, edited).expect("write compose file");
    if with_mounted_files {
        for path in [
            "Dockerfile",
            "config/compose/tessel-kafka.toml",
            "scripts/py/demo_orders.py",
        ] {
            let to = dir.path().join(path);
            std::fs::create_dir_all(to.parent().unwrap()).expect("mkdir");
            std::fs::copy(repo().join(path), &to).expect("copy");
        }
    }
    let out = compose_check(&["-q", file.to_str().expect("UTF-8 path")]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_rejected(edit: impl FnOnce(String) -> String, with_files: bool, expected: &[&str]) {
    let (ok, stderr) = check_edited(edit, with_files);
    assert!(!ok, "the broken compose file was accepted: {stderr}");
    for e in expected {
        assert!(stderr.contains(e), "the error does not say {e:?}: {stderr}");
    }
}

#[test]
fn compose_check_accepts_a_valid_copy() {
    let (ok, stderr) = check_edited(|s| s.replace("--count 20", "--count 21"), true);
    assert!(ok, "{stderr}");
}

#[test]
fn compose_check_rejects_an_unknown_top_level_key() {
    assert_rejected(
        |s| format!("{s}\nservicez: {{}}\n"),
        true,
        &["additional properties 'servicez' not allowed"],
    );
}

#[test]
fn compose_check_rejects_an_invalid_service_field() {
    assert_rejected(
        |s| s.replace("    ports: [\"9464:9464\"]", "    portz: [\"9464:9464\"]"),
        true,
        &["services.connector.portz"],
    );
    assert_rejected(
        |s| s.replace("      interval: 5s", "      interval: soon"),
        true,
        &["interval"],
    );
}

#[test]
fn compose_check_rejects_a_dependency_on_an_undefined_service() {
    assert_rejected(
        |s| s.replace("dispatcher: { condition:", "dispatchr: { condition:"),
        true,
        &["undefined service \"dispatchr\""],
    );
}

#[test]
fn compose_check_rejects_a_missing_mounted_file() {
    // Docker would mount an empty directory in place of the connector's config.
    assert_rejected(
        |s| s.replace("--count 20", "--count 21"),
        false,
        &["config/compose/tessel-kafka.toml does not exist"],
    );
}
