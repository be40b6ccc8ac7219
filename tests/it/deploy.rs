//! The Kubernetes manifests in `deploy/kubernetes/`, parsed and checked for what a cluster
//! would enforce or an operator would rely on: the Pod Security "restricted" profile, probes
//! and resources on every container, a PodDisruptionBudget, Service, ServiceMonitor and KEDA
//! ScaledObject that select the workload, the config checksum, and static membership from the
//! pod name through the environment overlay. No cluster or broker needed.

use std::collections::BTreeMap;

use serde::Deserialize as _;
use serde_yaml::Value;
use sha2::{Digest, Sha256};
use tessel_kafka::config::Config;

use crate::support::repo;

const MANIFEST: &str = "deploy/kubernetes/tessel-kafka.yaml";

/// Every document of the manifest.
fn documents() -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join(MANIFEST)).expect("manifest");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "exactly one {kind} in {MANIFEST}");
    found[0]
}

/// The Deployments and StatefulSets.
fn workloads(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
        .collect()
}

fn str_map(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether every `selector` label is on `labels`, and the selector is not empty.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().expect("metadata.name")
}

#[test]
fn every_container_meets_the_restricted_pod_security_profile() {
    let docs = documents();
    let workloads = workloads(&docs);
    assert!(!workloads.is_empty(), "a Deployment or StatefulSet");
    for w in workloads {
        let pod = &w["spec"]["template"]["spec"];
        let pod_sc = &pod["securityContext"];
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            assert_ne!(pod[host], Value::Bool(true), "{host}");
        }
        // Volume types the restricted profile allows.
        let mut writable = Vec::new();
        for v in pod["volumes"].as_sequence().into_iter().flatten() {
            let kinds: Vec<&str> = v
                .as_mapping()
                .unwrap()
                .keys()
                .filter_map(Value::as_str)
                .filter(|k| *k != "name")
                .collect();
            assert!(
                kinds.iter().all(|k| [
                    "configMap",
                    "secret",
                    "emptyDir",
                    "projected",
                    "downwardAPI",
                    "persistentVolumeClaim",
                    "csi",
                    "ephemeral"
                ]
                .contains(k)),
                "volume {v:?}"
            );
            if kinds == ["emptyDir"] {
                writable.push(v["name"].as_str().unwrap().to_owned());
            }
        }
        let containers: Vec<&Value> = ["initContainers", "containers"]
            .iter()
            .flat_map(|k| pod[*k].as_sequence().into_iter().flatten())
            .collect();
        assert!(!containers.is_empty());
        for c in containers {
            let cname = c["name"].as_str().unwrap();
            let sc = &c["securityContext"];
            let either = |key: &str| {
                if sc[key].is_null() {
                    &pod_sc[key]
                } else {
                    &sc[key]
                }
            };
            assert_eq!(either("runAsNonRoot"), &Value::Bool(true), "{cname}");
            assert_ne!(either("runAsUser"), &Value::from(0), "{cname} runs as root");
            assert_eq!(
                either("seccompProfile")["type"],
                "RuntimeDefault",
                "{cname} seccompProfile"
            );
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{cname}");
            assert_ne!(sc["privileged"], true, "{cname}");
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{cname}");
            let drop: Vec<&str> = sc["capabilities"]["drop"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            assert_eq!(drop, ["ALL"], "{cname} drops every capability");
            let added = sc["capabilities"]["add"].as_sequence().map_or(0, Vec::len);
            assert_eq!(added, 0, "{cname} adds no capability");
            // With a read-only root, every writable mount is an emptyDir.
            for m in c["volumeMounts"].as_sequence().into_iter().flatten() {
                let vname = m["name"].as_str().unwrap();
                if m["readOnly"] != true {
                    assert!(
                        writable.iter().any(|w| w == vname),
                        "{cname}: {vname} is writable but not an emptyDir"
                    );
                }
            }
            if pod["initContainers"]
                .as_sequence()
                .is_some_and(|s| s.contains(c))
            {
                continue;
            }
            // Probes on the named admin port, and resources.
            let ports: Vec<&str> = c["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            for probe in ["livenessProbe", "readinessProbe"] {
                let get = &c[probe]["httpGet"];
                assert!(get["path"].is_string(), "{cname} {probe}");
                assert!(
                    ports.contains(&get["port"].as_str().unwrap_or_default()),
                    "{cname} {probe} on a named container port"
                );
            }
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
            assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
            let r = &c["resources"];
            for (k, what) in [
                ("requests", "cpu"),
                ("requests", "memory"),
                ("limits", "memory"),
            ] {
                assert!(!r[k][what].is_null(), "{cname} resources.{k}.{what}");
            }
            assert!(
                !c["image"].as_str().unwrap_or("latest").ends_with(":latest"),
                "{cname} names a release, not latest"
            );
        }
    }
}

#[test]
fn pdb_service_monitor_and_scaler_select_the_workload() {
    let docs = documents();
    let workloads = workloads(&docs);
    assert_eq!(workloads.len(), 1, "one workload");
    let w = workloads[0];
    let kind = w["kind"].as_str().unwrap();
    let selector = str_map(&w["spec"]["selector"]["matchLabels"]);
    let pod_labels = str_map(&w["spec"]["template"]["metadata"]["labels"]);
    assert!(selects(&selector, &pod_labels), "workload selects its pods");

    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(
        str_map(&pdb["spec"]["selector"]["matchLabels"]),
        selector,
        "the PDB covers the workload's pods"
    );
    assert!(
        !pdb["spec"]["maxUnavailable"].is_null() || !pdb["spec"]["minAvailable"].is_null(),
        "the PDB bounds disruptions"
    );

    let service = one(&docs, "Service");
    assert!(selects(&str_map(&service["spec"]["selector"]), &pod_labels));
    let container_ports: Vec<&str> = w["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let service_ports: Vec<&str> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(
                container_ports.contains(&p["targetPort"].as_str().unwrap_or_default()),
                "service port {p:?} targets a named container port"
            );
            p["name"].as_str().unwrap()
        })
        .collect();
    if kind == "StatefulSet" {
        assert_eq!(w["spec"]["serviceName"].as_str(), Some(name(service)));
    }

    let monitor = one(&docs, "ServiceMonitor");
    assert!(selects(
        &str_map(&monitor["spec"]["selector"]["matchLabels"]),
        &str_map(&service["metadata"]["labels"])
    ));
    for e in monitor["spec"]["endpoints"].as_sequence().unwrap() {
        assert!(
            service_ports.contains(&e["port"].as_str().unwrap()),
            "{e:?}"
        );
        assert_eq!(e["path"], "/metrics");
    }
    // The Prometheus job is the Service's name; the alert rules select that job.
    let alerts = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).unwrap();
    assert!(alerts.contains(&format!("up{{job=\"{}\"}}", name(service))));
    // The dashboard's region variable comes from this pod label.
    for label in monitor["spec"]["podTargetLabels"].as_sequence().unwrap() {
        assert!(
            pod_labels.contains_key(label.as_str().unwrap()),
            "{label:?}"
        );
    }

    let scaler = one(&docs, "ScaledObject");
    let target = &scaler["spec"]["scaleTargetRef"];
    assert_eq!(target["kind"], kind);
    assert_eq!(target["name"].as_str(), Some(name(w)));
    let max = scaler["spec"]["maxReplicaCount"].as_u64().expect("a cap");
    let min = scaler["spec"]["minReplicaCount"].as_u64().unwrap_or(0);
    assert!(min >= 1 && max >= min, "{min}..{max}");
    let lag = tessel_kafka::telemetry::metrics::CONSUMER_LAG;
    assert!(
        scaler["spec"]["triggers"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|t| t["metadata"]["query"]
                .as_str()
                .is_some_and(|q| q.contains(lag))),
        "scales on {lag}"
    );
}

/// The ConfigMap's config.toml and the workload's container.
fn config_and_container(docs: &[Value]) -> (String, &Value) {
    let text = one(docs, "ConfigMap")["data"]["config.toml"]
        .as_str()
        .expect("config.toml")
        .to_owned();
    let w = workloads(docs)[0];
    (text, &w["spec"]["template"]["spec"]["containers"][0])
}

#[test]
fn pods_roll_when_the_config_changes_and_outlive_the_drain() {
    let docs = documents();
    let (text, _) = config_and_container(&docs);
    let w = workloads(&docs)[0];
    let checksum = hex::encode(Sha256::digest(text.as_bytes()));
    assert_eq!(
        w["spec"]["template"]["metadata"]["annotations"]["checksum/config"].as_str(),
        Some(checksum.as_str()),
        "checksum/config must be the sha256 of the ConfigMap's config.toml"
    );
    let config: toml::Table = text.parse().unwrap();
    let grace = w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    for (cname, c) in config["connections"].as_table().unwrap() {
        let drain = c
            .get("drain_timeout_ms")
            .and_then(toml::Value::as_integer)
            .unwrap_or(30_000) as u64;
        assert!(
            grace * 1000 > drain,
            "{cname}: grace {grace} s within drain {drain} ms"
        );
    }
}

/// Expands `$(VAR)` references the way the kubelet does, from earlier variables.
fn expand(value: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = value.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

#[test]
fn each_pod_joins_with_its_own_group_instance_id() {
    let docs = documents();
    let (text, container) = config_and_container(&docs);
    let w = workloads(&docs)[0];
    let pod_name = format!("{}-0", name(w));
    let labels = str_map(&w["spec"]["template"]["metadata"]["labels"]);
    let mut vars = BTreeMap::new();
    for e in container["env"].as_sequence().unwrap() {
        let key = e["name"].as_str().unwrap().to_owned();
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => expand(v, &vars),
            (None, Some("metadata.name")) => pod_name.clone(),
            (None, Some(path)) => {
                let label = path
                    .strip_prefix("metadata.labels['")
                    .and_then(|p| p.strip_suffix("']"))
                    .unwrap_or_else(|| panic!("unexpected fieldRef {path}"));
                labels
                    .get(label)
                    .unwrap_or_else(|| panic!("no pod label {label}"))
                    .clone()
            }
            _ => panic!("unexpected env {e:?}"),
        };
        let _ = vars.insert(key, value);
    }
    // The secret files the config reads, in a temporary directory.
    let secrets = tempfile::tempdir().unwrap();
    for f in ["kafka-password", "dispatcher-token"] {
        std::fs::write(secrets.path().join(f), "x").unwrap();
    }
    let text = text.replace(
        "/run/secrets/tessel-kafka",
        &secrets.path().display().to_string(),
    );
    let env: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| k.starts_with("TESSEL_KAFKA__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(!env.is_empty(), "the pod sets an override");
    let config = Config::from_toml_with_env(&text, env).expect("the pod's config loads");
    let want = format!("{}-{pod_name}", labels["region"]);
    for (cname, c) in &config.connections {
        assert_eq!(
            c.kafka.get("group.instance.id"),
            Some(&want),
            "{cname}: static membership from the pod name"
        );
        let client = tessel_kafka::kafka::consumer_config(cname, c);
        assert_eq!(client.get("group.instance.id"), Some(want.as_str()));
    }
}

/// The image runs as the user the pod security context names.
#[test]
fn the_image_user_is_the_pods_user() {
    let docs = documents();
    let w = workloads(&docs)[0];
    let uid = w["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let user = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    assert_eq!(user.trim(), uid.to_string());
}

/// The Dockerfile: base images as build arguments (to pin by digest), OCI labels, a
/// dependency layer before the sources, a binary without debug sections beside its debug
/// file, and a build context of sources only.
#[test]
fn the_dockerfile_builds_a_labelled_stripped_image_from_sources_only() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    for from in &froms {
        let image = from.split_whitespace().next().unwrap();
        assert!(
            image.starts_with("${") || image == "scratch",
            "FROM {from}: base images come from ARGs"
        );
    }
    for label in [
        "org.opencontainers.image.title",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.source",
        "org.opencontainers.image.licenses",
    ] {
        assert!(dockerfile.contains(label), "{label}");
    }
    let deps = dockerfile
        .find("COPY Cargo.toml Cargo.lock")
        .expect("manifest copied");
    let sources = dockerfile.find("COPY src ").expect("sources copied");
    let first_build = dockerfile.find("cargo build").expect("a build");
    assert!(
        deps < first_build && first_build < sources,
        "dependencies build before the sources arrive"
    );
    assert!(dockerfile.contains("objcopy --only-keep-debug"));
    assert!(dockerfile.contains("--add-gnu-debuglink"));
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let rules: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(rules, ["*", "!Cargo.toml", "!Cargo.lock", "!src/"]);
}
