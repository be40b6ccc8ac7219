//! Unit tests of `security`.
use super::*;

fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn jaas_scram_becomes_username_and_password() {
    let mut p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="tessel" password="p\"w d";"#,
        ),
    ]);
    let mut aws = None;
    let notices = normalize(&mut p, &mut aws).unwrap();
    assert_eq!(p["sasl.username"], "tessel");
    assert_eq!(p["sasl.password"], "p\"w d");
    assert!(!p.contains_key("sasl.jaas.config"));
    assert_eq!(notices.len(), 1);
    assert!(notices[0].contains("ScramLoginModule"), "{notices:?}");
    assert!(!notices[0].contains("p\"w d"));
    assert_eq!(
        auth_of(&p, None).unwrap(),
        KafkaAuth::Sasl {
            mechanism: SaslMechanism::ScramSha512,
            tls: true
        }
    );
}

#[test]
fn confluent_cloud_snippet_translates() {
    // As the Confluent Cloud console hands it out (Java client).
    let mut p = props(&[
        ("bootstrap.servers", "pkc-xxxxx.us-east-1.aws.confluent.cloud:9092"),
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required username='KEY' password='SECRET';"),
        ("client.dns.lookup", "use_all_dns_ips"),
        ("session.timeout.ms", "45000"),
    ]);
    let notices = normalize(&mut p, &mut None).unwrap();
    assert_eq!(p["sasl.mechanism"], "PLAIN");
    assert!(!p.contains_key("sasl.mechanisms"));
    assert!(!p.contains_key("client.dns.lookup"));
    assert_eq!(p["sasl.username"], "KEY");
    assert_eq!(p["sasl.password"], "SECRET");
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert!(notices.iter().all(|n| !n.contains("SECRET")));
}

#[test]
fn jaas_conflicting_with_explicit_username_is_refused() {
    let mut p = props(&[
        ("sasl.username", "other"),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";"#,
        ),
    ]);
    let err = normalize(&mut p, &mut None).unwrap_err().to_string();
    assert!(err.contains("sasl.username"), "{err}");
}

#[test]
fn jaas_syntax_errors_do_not_echo_the_text() {
    for text in [
        r#"ScramLoginModule username="u" password="hunter2";"#,
        r#"ScramLoginModule required username="u" password="hunter2"#,
        r#"ScramLoginModule required ="hunter2";"#,
    ] {
        let err = parse_jaas(text).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("sasl.jaas.config"), "{err}");
    }
}

#[test]
fn oauthbearer_jaas_and_endpoint_select_oidc() {
    let mut p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "https://idp.example/oauth2/token",
        ),
        (
            "sasl.login.callback.handler.class",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        ),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="cid" clientSecret="csecret" scope="kafka" extension_logicalCluster="lkc-1";"#,
        ),
    ]);
    let _ = normalize(&mut p, &mut None).unwrap();
    assert_eq!(p["sasl.oauthbearer.method"], "oidc");
    assert_eq!(p["sasl.oauthbearer.client.id"], "cid");
    assert_eq!(p["sasl.oauthbearer.client.secret"], "csecret");
    assert_eq!(p["sasl.oauthbearer.scope"], "kafka");
    assert_eq!(p["sasl.oauthbearer.extensions"], "logicalCluster=lkc-1");
    assert!(!p.contains_key("sasl.login.callback.handler.class"));
    assert_eq!(
        auth_of(&p, None).unwrap(),
        KafkaAuth::Sasl {
            mechanism: SaslMechanism::OauthbearerOidc,
            tls: true
        }
    );
}

#[test]
fn oauthbearer_without_oidc_is_refused() {
    let p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
    ]);
    let err = auth_of(&p, None).unwrap_err().to_string();
    assert!(err.contains("sasl.oauthbearer.token.endpoint.url"), "{err}");
}

#[test]
fn msk_iam_snippet_selects_the_signer() {
    let mut p = props(&[
        (
            "bootstrap.servers",
            "b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com:9098",
        ),
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "AWS_MSK_IAM"),
        (
            "sasl.jaas.config",
            "software.amazon.msk.auth.iam.IAMLoginModule required;",
        ),
        (
            "sasl.client.callback.handler.class",
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
        ),
    ]);
    let mut aws = None;
    let notices = normalize(&mut p, &mut aws).unwrap();
    assert_eq!(p["sasl.mechanism"], "OAUTHBEARER");
    assert_eq!(aws, Some(AwsIamConfig::default()));
    assert_eq!(notices.len(), 3, "{notices:?}");
    assert_eq!(
        auth_of(&p, aws.as_ref()).unwrap(),
        KafkaAuth::Sasl {
            mechanism: SaslMechanism::AwsMskIam,
            tls: true
        }
    );
    assert_eq!(
        region_from_bootstrap(&p["bootstrap.servers"]).as_deref(),
        Some("eu-west-1")
    );
}

#[test]
fn msk_iam_profile_option_becomes_the_aws_profile() {
    let mut p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "AWS_MSK_IAM"),
        (
            "sasl.jaas.config",
            r#"software.amazon.msk.auth.iam.IAMLoginModule required awsProfileName="msk-reader";"#,
        ),
    ]);
    let mut aws = None;
    let notices = normalize(&mut p, &mut aws).unwrap();
    assert_eq!(aws.unwrap().profile.as_deref(), Some("msk-reader"));
    assert!(
        notices.iter().any(|n| n.contains("awsProfileName")),
        "{notices:?}"
    );
    let mut p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "AWS_MSK_IAM"),
        (
            "sasl.jaas.config",
            r#"software.amazon.msk.auth.iam.IAMLoginModule required awsRoleArn="arn:aws:iam::1:role/x";"#,
        ),
    ]);
    let err = normalize(&mut p, &mut None).unwrap_err().to_string();
    assert!(err.contains("awsRoleArn"), "{err}");
}

#[test]
fn msk_iam_needs_tls() {
    let mut p = props(&[
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanism", "AWS_MSK_IAM"),
    ]);
    let mut aws = None;
    let _ = normalize(&mut p, &mut aws).unwrap();
    assert!(auth_of(&p, aws.as_ref())
        .unwrap_err()
        .to_string()
        .contains("SASL_SSL"));
}

#[test]
fn mtls_needs_certificate_and_key() {
    let p = props(&[
        ("security.protocol", "SSL"),
        ("ssl.certificate.location", "/c.pem"),
    ]);
    let err = auth_of(&p, None).unwrap_err().to_string();
    assert!(err.contains("ssl.key.location"), "{err}");
    let p = props(&[
        ("security.protocol", "ssl"),
        ("ssl.certificate.location", "/c.pem"),
        ("ssl.key.location", "/k.pem"),
    ]);
    let mut p2 = p.clone();
    let _ = normalize(&mut p2, &mut None).unwrap();
    assert_eq!(auth_of(&p2, None).unwrap(), KafkaAuth::Ssl { mutual: true });
}

#[test]
fn sasl_without_credentials_is_refused() {
    let p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-256"),
        ("sasl.username", "u"),
    ]);
    let err = auth_of(&p, None).unwrap_err().to_string();
    assert!(err.contains("sasl.password"), "{err}");
    let p = props(&[("security.protocol", "SASL_SSL")]);
    assert!(auth_of(&p, None)
        .unwrap_err()
        .to_string()
        .contains("sasl.mechanism"));
    let p = props(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "GSSAPI"),
    ]);
    assert!(auth_of(&p, None).is_err());
    let p = props(&[("security.protocol", "TLS")]);
    assert!(auth_of(&p, None).is_err());
}

#[test]
fn pem_truststore_becomes_ca_location_and_jks_is_refused() {
    let mut p = props(&[
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", "/etc/ca.pem"),
    ]);
    let _ = normalize(&mut p, &mut None).unwrap();
    assert_eq!(p["ssl.ca.location"], "/etc/ca.pem");
    let mut p = props(&[("ssl.truststore.location", "/etc/client.truststore.jks")]);
    let err = normalize(&mut p, &mut None).unwrap_err().to_string();
    assert!(err.contains("ssl.ca.location"), "{err}");
}

#[test]
fn empty_endpoint_identification_means_none() {
    let mut p = props(&[("ssl.endpoint.identification.algorithm", "")]);
    let _ = normalize(&mut p, &mut None).unwrap();
    assert_eq!(p["ssl.endpoint.identification.algorithm"], "none");
}
