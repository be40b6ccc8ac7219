use super::*;

use std::collections::BTreeSet;

const MINIMAL: &str = r#"
[connections.orders.kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "tessel-orders"
"sasl.password" = "hunter2"

[connections.orders.triggers.fraud]
topics = ["payments"]
workflow = "fraud-check"
dispatcher = { url = "http://127.0.0.1:8080/runs" }
"#;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_with_env(text, Vec::new())
}

#[test]
fn minimal_config_gets_documented_defaults() {
    let c = load(MINIMAL).unwrap();
    let conn = &c.connections["orders"];
    assert_eq!(conn.group_id(), "tessel-orders");
    assert_eq!(conn.drain_timeout_ms, 30_000);
    let t = &conn.triggers["fraud"];
    assert_eq!(t.concurrency, 16);
    assert_eq!(t.ordering, Ordering::Key);
    assert_eq!(t.value_format, PayloadFormat::Auto);
    assert_eq!(c.server.listen.port(), 9464);
}

#[test]
fn unknown_key_is_named() {
    let text = MINIMAL.replace("workflow = ", "wrokflow = \"x\"\nworkflow = ");
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("wrokflow"), "{err}");
    assert!(err.contains("connections.orders.triggers.fraud"), "{err}");
    assert!(!err.contains('\n'));
}

#[test]
fn missing_bootstrap_servers_is_named() {
    let text = MINIMAL.replace("\"bootstrap.servers\" = \"127.0.0.1:9092\"\n", "");
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("bootstrap.servers"), "{err}");
}

#[test]
fn trigger_without_topics_is_refused() {
    let text = MINIMAL.replace("topics = [\"payments\"]", "topics = []");
    let err = load(&text).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.triggers.fraud.topics"),
        "{err}"
    );
}

#[test]
fn read_uncommitted_is_refused_with_the_reason() {
    let text = MINIMAL.replace(
        "\"group.id\"",
        "\"isolation.level\" = \"read_uncommitted\"\n\"group.id\"",
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("isolation.level"), "{err}");
    assert!(err.contains("aborted transactions"), "{err}");
}

#[test]
fn env_overrides_kafka_properties_and_fields() {
    let env = vec![
        (
            "TESSEL_KAFKA__CONNECTIONS__ORDERS__KAFKA__BOOTSTRAP_SERVERS".to_owned(),
            "broker:9093".to_owned(),
        ),
        (
            "TESSEL_KAFKA__CONNECTIONS__ORDERS__TRIGGERS__FRAUD__CONCURRENCY".to_owned(),
            "64".to_owned(),
        ),
        (
            "TESSEL_KAFKA__CONNECTIONS__ORDERS__TRIGGERS__FRAUD__TOPICS".to_owned(),
            "[\"a\", \"b\"]".to_owned(),
        ),
    ];
    let c = Config::from_toml_with_env(MINIMAL, env).unwrap();
    let conn = &c.connections["orders"];
    assert_eq!(conn.kafka["bootstrap.servers"], "broker:9093");
    assert_eq!(conn.triggers["fraud"].concurrency, 64);
    assert_eq!(conn.triggers["fraud"].topics, vec!["a", "b"]);
}

#[test]
fn secrets_are_redacted_in_output() {
    let text = MINIMAL.replace(
        "dispatcher = { url = \"http://127.0.0.1:8080/runs\" }",
        "dispatcher = { url = \"http://127.0.0.1:8080/runs\", token = \"tok-s3cret\" }",
    );
    let c = load(&text).unwrap();
    let shown = toml::to_string(&c).unwrap();
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(!shown.contains("tok-s3cret"), "{shown}");
    assert!(!format!("{c:?}").contains("tok-s3cret"));
    assert!(shown.contains(REDACTED));
}

#[test]
fn a_topic_belongs_to_one_trigger() {
    let text = format!(
        "{MINIMAL}\n[connections.orders.triggers.other]\ntopics = [\"payments\"]\nworkflow = \"w\"\ndispatcher = {{ url = \"http://x/\" }}\n"
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("payments"), "{err}");
}

#[test]
fn example_config_is_valid() {
    let text = include_str!("../../config/example.toml")
        .replace("{ env = \"TESSEL_ORDERS_KAFKA_PASSWORD\" }", "\"from-env\"");
    let c = load(&text).unwrap();
    assert!(!c.connections.is_empty());
}

#[test]
fn missing_secret_source_is_named() {
    let text = MINIMAL.replace("\"hunter2\"", "{ env = \"TESSEL_TEST_SURELY_UNSET_VAR\" }");
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("TESSEL_TEST_SURELY_UNSET_VAR"), "{err}");
    assert!(err.contains("sasl.password"), "{err}");
}

#[test]
fn compose_config_is_valid() {
    let c = load(include_str!("../../config/compose/tessel-kafka.toml")).unwrap();
    assert_eq!(c.connections["demo"].group_id(), "tessel-demo");
}

#[test]
fn kubernetes_example_config_is_valid() {
    let manifest = include_str!("../../deploy/kubernetes/tessel-kafka.yaml");
    let start = manifest.find("config.toml: |").unwrap();
    let block: String = manifest[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    // The secret files exist only in the cluster.
    let block = block
        .replace(
            "{ file = \"/run/secrets/tessel-kafka/kafka-password\" }",
            "\"x\"",
        )
        .replace(
            "{ file = \"/run/secrets/tessel-kafka/dispatcher-token\" }",
            "\"y\"",
        );
    let c = load(&block).unwrap();
    assert_eq!(c.connections["orders"].group_id(), "tessel-orders");
}

/// Every file a secret came from is known to the daemon (which watches them), whichever way
/// it was named: `{ file = … }`, `"<property>_file"` or `.file` from the environment.
#[test]
fn the_files_secrets_were_read_from_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let (password, token) = (dir.path().join("kafka-password"), dir.path().join("token"));
    std::fs::write(&password, "p\n").unwrap();
    std::fs::write(&token, "t").unwrap();
    let text = MINIMAL
        .replace(
            "\"sasl.password\" = \"hunter2\"",
            &format!("\"sasl.password_file\" = \"{}\"", password.display()),
        )
        .replace(
            "dispatcher = { url = \"http://127.0.0.1:8080/runs\" }",
            &format!(
                "dispatcher = {{ url = \"http://127.0.0.1:8080/runs\", token = {{ file = \"{}\" }} }}",
                token.display()
            ),
        );
    let c = load(&text).unwrap();
    assert_eq!(
        c.secret_files().iter().collect::<Vec<_>>(),
        [&password, &token]
    );
    assert!(load(MINIMAL).unwrap().secret_files().is_empty());
    let env = vec![(
        "TESSEL_KAFKA__CONNECTIONS__ORDERS__KAFKA__SSL_KEY_PASSWORD_FILE".to_owned(),
        token.display().to_string(),
    )];
    let c = Config::from_toml_with_env(MINIMAL, env).unwrap();
    assert_eq!(c.secret_files().iter().collect::<Vec<_>>(), [&token]);
}

#[test]
fn property_file_keys_read_secrets_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("kafka-password");
    std::fs::write(&secret, "from-a-file\n").unwrap();
    let text = MINIMAL.replace(
        "\"sasl.password\" = \"hunter2\"",
        &format!("\"sasl.password_file\" = \"{}\"", secret.display()),
    );
    let c = load(&text).unwrap();
    assert_eq!(
        c.connections["orders"].kafka["sasl.password"],
        "from-a-file"
    );
    assert!(!toml::to_string(&c).unwrap().contains("from-a-file"));

    // From the environment the suffix is `.file` (underscores stand for dots).
    let text = MINIMAL.replace("\"sasl.password\" = \"hunter2\"\n", "");
    let env = vec![(
        "TESSEL_KAFKA__CONNECTIONS__ORDERS__KAFKA__SASL_PASSWORD_FILE".to_owned(),
        secret.display().to_string(),
    )];
    let c = Config::from_toml_with_env(&text, env).unwrap();
    assert_eq!(
        c.connections["orders"].kafka["sasl.password"],
        "from-a-file"
    );

    let missing = MINIMAL.replace(
        "\"sasl.password\" = \"hunter2\"",
        "\"sasl.password_file\" = \"/nonexistent/tessel-secret\"",
    );
    let err = load(&missing).unwrap_err().to_string();
    assert!(
        err.contains("sasl.password_file") && err.contains("/nonexistent/tessel-secret"),
        "{err}"
    );

    let twice = MINIMAL.replace(
        "\"sasl.password\" = \"hunter2\"",
        &format!(
            "\"sasl.password\" = \"x\"\n\"sasl.password_file\" = \"{}\"",
            secret.display()
        ),
    );
    assert!(load(&twice).unwrap_err().to_string().contains("twice"));
}

#[test]
fn pasted_jaas_config_is_translated_with_a_notice_and_redacted() {
    let text = MINIMAL.replace(
        "\"sasl.password\" = \"hunter2\"",
        r#""security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.jaas.config" = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="tessel" password="jaas-s3cret";'"#,
    );
    let c = load(&text).unwrap();
    let conn = &c.connections["orders"];
    assert_eq!(conn.kafka["sasl.username"], "tessel");
    assert_eq!(conn.kafka["sasl.password"], "jaas-s3cret");
    let notices = c.notices();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].starts_with("connection orders: translated"),
        "{notices:?}"
    );
    let shown = format!("{}{c:?}{notices:?}", toml::to_string(&c).unwrap());
    assert!(!shown.contains("jaas-s3cret"), "{shown}");
}

#[test]
fn sasl_without_a_password_is_refused_at_load() {
    let text = MINIMAL.replace(
        "\"sasl.password\" = \"hunter2\"",
        "\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"PLAIN\"\n\"sasl.username\" = \"u\"",
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.kafka") && err.contains("sasl.password"),
        "{err}"
    );
}

#[test]
fn produced_topics_are_dead_letter_topics_and_the_produce_grant() {
    let c = load(MINIMAL).unwrap();
    assert!(c.connections["orders"].produced_topics().is_empty());
    let text = format!(
        "{}\n[connections.orders.triggers.other]\ntopics = [\"refunds\"]\nworkflow = \"w\"\non_error = \"dead_letter\"\ndead_letter_topic = \"refunds-dlq\"\ndispatcher = {{ url = \"http://x/\" }}\n",
        MINIMAL.replace(
            "[connections.orders.kafka]",
            "[connections.orders]\nproduce_topics = [\"audit\"]\n[connections.orders.kafka]"
        )
    );
    let c = load(&text).unwrap();
    let produced: Vec<&str> = c.connections["orders"]
        .produced_topics()
        .into_iter()
        .collect();
    assert_eq!(produced, vec!["audit", "refunds-dlq"]);
}

#[test]
fn registry_client_certificate_needs_its_key() {
    let text = format!(
        "{MINIMAL}\n[connections.orders.schema_registry]\nurl = \"https://registry\"\ncertificate_location = \"/c.pem\"\n"
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("key_location"), "{err}");
}

#[test]
fn produced_topics_include_exact_topics_of_produce_grants() {
    let text = format!(
        "{MINIMAL}\n[produce.tokens.wf]\ntoken = \"0123456789abcdef\"\nconnections = [\"orders\"]\ntopics = [\"audit\", \"cdc.*\"]"
    );
    let c = load(&text).unwrap();
    let produced: Vec<String> = c.produced_topics("orders").into_iter().collect();
    assert_eq!(produced, vec!["audit".to_owned()]);
}

#[test]
fn credential_like_dispatcher_headers_are_redacted() {
    let text = MINIMAL.replace(
        "dispatcher = { url = \"http://127.0.0.1:8080/runs\" }",
        "dispatcher = { url = \"http://127.0.0.1:8080/runs\", headers = { \"X-Api-Key\" = \"hdr-s3cret\", \"X-Tenant\" = \"acme\" } }",
    );
    let c = load(&text).unwrap();
    assert_eq!(
        c.connections["orders"].triggers["fraud"].dispatcher.headers["X-Api-Key"],
        "hdr-s3cret"
    );
    let shown = format!("{}{c:?}", toml::to_string(&c).unwrap());
    assert!(!shown.contains("hdr-s3cret"), "{shown}");
    assert!(shown.contains("acme"), "{shown}");
}

#[test]
fn producer_properties_take_secret_sources_and_are_redacted() {
    let text = format!(
        "{MINIMAL}\n[connections.orders.producer]\nkafka = {{ \"linger.ms\" = 5, \"sasl.password\" = \"producer-only-secret\" }}\n"
    );
    let c = load(&text).unwrap();
    let p = &c.connections["orders"].producer;
    assert_eq!(p.kafka["linger.ms"], "5");
    assert_eq!(p.kafka["sasl.password"], "producer-only-secret");
    let printed = toml::to_string_pretty(&c).unwrap();
    let debug = format!("{c:?}");
    for out in [&printed, &debug] {
        assert!(!out.contains("producer-only-secret"), "{out}");
        assert!(out.contains("linger.ms"), "{out}");
    }
}

#[test]
fn a_connection_without_triggers_only_produces_and_needs_a_grant() {
    let produce_only = r#"
[connections.cdc.kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"#;
    let err = load(produce_only).unwrap_err().to_string();
    assert!(err.contains("connections.cdc.triggers"), "{err}");
    assert!(err.contains("[produce] token"), "{err}");
    let granted = format!(
        "{produce_only}\n[produce.tokens.wf]\ntoken = \"0123456789abcdef\"\nconnections = [\"cdc\"]\ntopics = [\"changes\"]"
    );
    let c = load(&granted).unwrap();
    assert!(!c.connections["cdc"].consumes());
    assert_eq!(
        c.produced_topics("cdc").into_iter().collect::<Vec<_>>(),
        vec!["changes".to_owned()]
    );
    // A consuming connection still needs its group.
    let text = MINIMAL.replace("\"group.id\" = \"tessel-orders\"\n", "");
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("group.id"), "{err}");
}

#[test]
fn kafka_properties_librdkafka_does_not_know_or_take_are_refused_before_connecting() {
    let misspelt = MINIMAL.replace(
        "\"group.id\"",
        "\"sesion.timeout.ms\" = \"10000\"\n\"group.id\"",
    );
    let err = load(&misspelt).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.kafka.\"sesion.timeout.ms\""),
        "{err}"
    );
    assert!(err.contains("No such configuration property"), "{err}");
    let bad_value = MINIMAL.replace(
        "\"group.id\"",
        "\"session.timeout.ms\" = \"ten seconds\"\n\"group.id\"",
    );
    let err = load(&bad_value).unwrap_err().to_string();
    assert!(err.contains("\"session.timeout.ms\""), "{err}");
    assert!(err.contains("ten seconds"), "{err}");
    let producer =
        format!("{MINIMAL}\n[connections.orders.producer.kafka]\n\"linger.ms\" = \"-5\"\n");
    let err = load(&producer).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.producer.kafka.\"linger.ms\""),
        "{err}"
    );
}

#[test]
fn topic_patterns_are_checked_and_resolve_after_named_topics() {
    let text = MINIMAL.replace(
        "topics = [\"payments\"]",
        "topics = [\"^orders\\\\.(eu|us)$\", \"payments\"]",
    );
    let c = load(&text).expect("a pattern and a name");
    let conn = &c.connections["orders"];
    assert!(conn.has_patterns());
    assert_eq!(conn.trigger_for("orders.eu").map(|t| t.0), Some("fraud"));
    assert_eq!(conn.trigger_for("payments").map(|t| t.0), Some("fraud"));
    assert!(conn.trigger_for("orders.asia").is_none());
    let bad = MINIMAL.replace("topics = [\"payments\"]", "topics = [\"^orders.(\"]");
    let err = load(&bad).unwrap_err().to_string();
    assert!(
        err.contains("triggers.fraud.topics") && err.contains("not a regular expression"),
        "{err}"
    );
    // A dead-letter topic the pattern matches would feed dead letters back in.
    let loop_ = MINIMAL.replace(
        "topics = [\"payments\"]",
        "topics = [\"^pay.*\"]\non_error = \"dead_letter\"\ndead_letter_topic = \"payments-dlq\"",
    );
    let err = load(&loop_).unwrap_err().to_string();
    assert!(err.contains("dead_letter_topic"), "{err}");
}

#[test]
fn a_bad_filter_is_refused_with_the_trigger_and_the_position() {
    let text = MINIMAL.replace(
        "workflow = \"fraud-check\"",
        "workflow = \"fraud-check\"\nfilter = 'value.amount > 1000.0 &&& headers.source == \"x\"'",
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.triggers.fraud.filter"),
        "{err}"
    );
    assert!(err.contains("line 1, column 25"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    let text = MINIMAL.replace(
        "workflow = \"fraud-check\"",
        "workflow = \"fraud-check\"\nfilter = 'amount > 3'",
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(err.contains("unknown variable `amount`"), "{err}");
    // Nested past the limit: refused before the CEL parser could overflow the stack.
    let text = MINIMAL.replace(
        "workflow = \"fraud-check\"",
        &format!(
            "workflow = \"fraud-check\"\nfilter = '{}true{}'",
            "(".repeat(5_000),
            ")".repeat(5_000)
        ),
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.triggers.fraud.filter"),
        "{err}"
    );
    assert!(
        err.contains("nested too deeply: the parenthesis at line 1, column 33 goes past 32 levels"),
        "{err}"
    );
    let text = MINIMAL.replace(
        "workflow = \"fraud-check\"",
        "workflow = \"fraud-check\"\nfilter = 'value.amount > 1000.0'",
    );
    let c = load(&text).unwrap();
    let filter = c.connections["orders"].triggers["fraud"].filter.as_ref();
    assert_eq!(filter.map(|f| f.source()), Some("value.amount > 1000.0"));
}

#[test]
fn record_age_and_envelope_defaults_and_rules() {
    let c = load(MINIMAL).unwrap();
    let t = &c.connections["orders"].triggers["fraud"];
    assert_eq!(t.max_record_age_ms, None);
    assert_eq!(t.on_expired, ExpiredPolicy::Skip);
    assert_eq!(t.dispatcher.envelope, Envelope::Tessel);
    assert_eq!(t.dispatcher.cloudevents_type, "dev.tessel.kafka.record");
    assert!(!t.dead_letters());
    let text = MINIMAL.replace(
        "workflow = \"fraud-check\"",
        "workflow = \"fraud-check\"\nmax_record_age_ms = 60000\non_expired = \"dead_letter\"",
    );
    let err = load(&text).unwrap_err().to_string();
    assert!(
        err.contains("connections.orders.triggers.fraud.dead_letter_topic"),
        "{err}"
    );
    let text = text.replace(
        "on_expired = \"dead_letter\"",
        "on_expired = \"dead_letter\"\ndead_letter_topic = \"late\"",
    );
    let c = load(&text).unwrap();
    // on_error stays block: the producer still starts for expired records.
    assert!(c.connections["orders"].triggers["fraud"].dead_letters());
    assert!(c.connections["orders"].dead_letters());
}

#[test]
fn batch_defaults_and_rules() {
    let c = load(MINIMAL).unwrap();
    assert_eq!(c.connections["orders"].triggers["fraud"].batch, None);
    let with = |batch: &str| {
        MINIMAL.replace(
            "workflow = \"fraud-check\"",
            &format!("workflow = \"fraud-check\"\n{batch}"),
        )
    };
    let c = load(&with("batch = {}")).unwrap();
    assert_eq!(
        c.connections["orders"].triggers["fraud"].batch,
        Some(crate::config::BatchConfig {
            max_records: 500,
            max_bytes: 1 << 20,
            max_wait_ms: 1000
        })
    );
    for (bad, key) in [
        ("batch = { max_records = 0 }", "triggers.fraud.batch"),
        ("batch = { max_bytes = 0 }", "triggers.fraud.batch"),
        (
            "batch = { max_wait_ms = 3600001 }",
            "triggers.fraud.batch.max_wait_ms",
        ),
        (
            "batch = { max_records = 20000 }",
            "triggers.fraud.batch.max_records",
        ),
        (
            "batch = {}\nordering = \"unordered\"",
            "triggers.fraud.batch",
        ),
        ("batch = { max_recods = 5 }", "max_recods"),
    ] {
        let err = load(&with(bad)).unwrap_err().to_string();
        assert!(err.contains(key), "{bad}: {err}");
    }
    // However large the partition buffer, a batch's records fit the commit metadata.
    let big_buffer = with("batch = { max_records = 10001 }").replace(
        "[connections.orders.kafka]",
        "[connections.orders]\nmax_buffered_per_partition = 50000\n[connections.orders.kafka]",
    );
    assert!(big_buffer.contains("max_buffered_per_partition = 50000"));
    let err = load(&big_buffer).unwrap_err().to_string();
    assert!(err.contains("at most 10000"), "{err}");
}

#[test]
fn dispatcher_tls_and_proxy_settings_are_checked_with_exact_errors() {
    let with = |fields: &str| {
        MINIMAL.replace(
            "dispatcher = { url = \"http://127.0.0.1:8080/runs\" }",
            &format!("dispatcher = {{ {fields} }}"),
        )
    };
    let key = "connections.orders.triggers.fraud.dispatcher";
    for (fields, at, reason) in [
        (
            "url = \"https://runs\", certificate_location = \"/c.pem\"",
            key.to_owned(),
            "certificate_location and key_location go together (dispatcher mTLS)",
        ),
        (
            "url = \"https://runs\", key_location = \"/c.key\"",
            key.to_owned(),
            "certificate_location and key_location go together (dispatcher mTLS)",
        ),
        (
            "url = \"http://runs\", ca_location = \"/ca.pem\"",
            key.to_owned(),
            "ca_location, certificate_location and key_location need an https:// url",
        ),
        (
            "url = \"https://runs\", proxy = \"https://proxy:3128\"",
            format!("{key}.proxy"),
            "must be an http:// URL (the tunnel to the proxy itself is not TLS)",
        ),
        (
            "url = \"https://runs\", proxy = \"http://proxy:3128/path\"",
            format!("{key}.proxy"),
            "must be http://[user:password@]host[:port], with no path or query",
        ),
    ] {
        let err = load(&with(fields)).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("invalid config at `{at}`: {reason}"),
            "{fields}"
        );
    }
    let c = load(&with(
        "url = \"https://runs\", ca_location = \"/ca.pem\", certificate_location = \"/c.pem\", key_location = \"/c.key\", proxy = \"http://u:pr0xy-s3cret@proxy:3128\"",
    ))
    .unwrap();
    let d = &c.connections["orders"].triggers["fraud"].dispatcher;
    assert_eq!(
        d.ca_location.as_deref(),
        Some(std::path::Path::new("/ca.pem"))
    );
    assert_eq!(d.proxy.as_ref().unwrap().expose().port(), Some(3128));
    let shown = format!("{d:?} {}", toml::to_string(&c).unwrap());
    assert!(!shown.contains("pr0xy-s3cret"), "{shown}");
}

#[path = "reference_tests.rs"]
mod reference;

/// `region.static_membership`: every consuming connection, those added later included, joins
/// with `<region>-<replica>` as its group.instance.id, without being named; one that sets its
/// own keeps it. From the environment, as the Helm chart sets it.
#[test]
fn static_membership_gives_every_consuming_connection_the_replicas_instance_id() {
    let two = format!(
        "{MINIMAL}{}",
        MINIMAL
            .replace("connections.orders", "connections.cdc-users")
            .replace(
                "\"group.id\" = \"tessel-orders\"",
                "\"group.id\" = \"cdc\"\n\"group.instance.id\" = \"own\""
            )
    );
    let env = |on: &str| {
        vec![
            (
                "TESSEL_KAFKA__REGION__NAME".to_owned(),
                "eu-west-1".to_owned(),
            ),
            (
                "TESSEL_KAFKA__REGION__REPLICA_ID".to_owned(),
                "tessel-kafka-2".to_owned(),
            ),
            (
                "TESSEL_KAFKA__REGION__STATIC_MEMBERSHIP".to_owned(),
                on.to_owned(),
            ),
        ]
    };
    let c = Config::from_toml_with_env(&two, env("true")).unwrap();
    assert_eq!(
        c.connections["orders"]
            .kafka
            .get("group.instance.id")
            .map(String::as_str),
        Some("eu-west-1-tessel-kafka-2")
    );
    assert_eq!(
        c.connections["cdc-users"]
            .kafka
            .get("group.instance.id")
            .map(String::as_str),
        Some("own")
    );
    let off = Config::from_toml_with_env(&two, env("false")).unwrap();
    assert!(!off.connections["orders"]
        .kafka
        .contains_key("group.instance.id"));
    // The drain must fit the session of a static member: the usual check applies.
    let long_drain = two.replace(
        "[connections.orders.kafka]",
        "[connections.orders]\ndrain_timeout_ms = 50000\n[connections.orders.kafka]",
    );
    let err = Config::from_toml_with_env(&long_drain, env("true"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("session.timeout.ms"), "{err}");
}
