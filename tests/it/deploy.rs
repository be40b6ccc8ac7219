//! The Helm chart in `deploy/helm/tessel-kafka` and the plain manifest rendered from it
//! (`deploy/kubernetes/`), parsed and checked for what a cluster would enforce or an operator
//! would rely on: the Pod Security "restricted" profile, probes and resources on every
//! container, a PodDisruptionBudget, Service, ServiceMonitor, KEDA ScaledObject, NetworkPolicy
//! and ServiceAccount that match the workload, the computed config checksum, and static
//! membership from the pod name through the environment overlay. Each check runs on the
//! default rendering and on one with KEDA, a NetworkPolicy, IRSA and a chart-made Secret on
//! (`ci/keda-netpol-irsa-values.yaml`, in a namespace of its own). The chart is rendered by
//! `scripts/chart-check template` (Helm, a Go module, installed once into the cache); no
//! cluster or broker needed.

use std::collections::BTreeMap;
use std::process::Command;

use serde::Deserialize as _;
use serde_yaml::Value;
use sha2::{Digest, Sha256};
use tessel_kafka::config::Config;

use crate::support::repo;

const MANIFEST: &str = "deploy/kubernetes/tessel-kafka.yaml";
const OPTIONAL_VALUES: &str = "deploy/helm/tessel-kafka/ci/keda-netpol-irsa-values.yaml";
/// Values with things managed elsewhere and two connections.
const EXTERNAL_VALUES: &str = "deploy/helm/tessel-kafka/ci/external-values.yaml";
/// The namespace the optional rendering is made for.
const NAMESPACE: &str = "payments-eu";

fn parse(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every document of the plain manifest.
fn documents() -> Vec<Value> {
    parse(&std::fs::read_to_string(repo().join(MANIFEST)).expect("manifest"))
}

/// `helm template` of the chart with these arguments (values files, namespace).
fn render(args: &[&str]) -> Vec<Value> {
    let go = Command::new("go").arg("version").output();
    assert!(
        go.is_ok_and(|o| o.status.success()),
        "`go` is missing: scripts/chart-check installs Helm with Go; run scripts/deps"
    );
    let out = Command::new(repo().join("scripts/chart-check"))
        .arg("template")
        .args(args)
        .output()
        .expect("run scripts/chart-check");
    assert!(
        out.status.success(),
        "helm template {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(std::str::from_utf8(&out.stdout).expect("UTF-8"))
}

/// The chart with its optional parts on, in [`NAMESPACE`].
fn optional_rendering() -> Vec<Value> {
    let values = repo().join(OPTIONAL_VALUES);
    render(&["-f", values.to_str().unwrap(), "--namespace", NAMESPACE])
}

/// The renderings every check runs on: the plain manifest and the optional one.
fn renderings() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        (MANIFEST, documents()),
        (OPTIONAL_VALUES, optional_rendering()),
    ]
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "exactly one {kind}");
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
fn the_plain_manifest_is_the_charts_default_rendering() {
    let manifest = documents();
    assert_eq!(
        manifest,
        render(&[]),
        "{MANIFEST} differs from the chart's default rendering: run scripts/render-manifests"
    );
    // No object names a namespace: `kubectl apply -n NS` puts it anywhere.
    for d in &manifest {
        assert!(d["metadata"]["namespace"].is_null(), "{}", name(d));
    }
}

#[test]
fn every_container_meets_the_restricted_pod_security_profile() {
    for (label, docs) in renderings() {
        println!("{label}");
        restricted_profile_probes_and_resources(&docs);
    }
}

fn restricted_profile_probes_and_resources(docs: &[Value]) {
    let workloads = workloads(docs);
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
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
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

/// The label matchers of a PromQL selector (`name="value"`), from its first `{...}`.
fn matchers(query: &str) -> BTreeMap<String, String> {
    let inner = query
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(inner, _)| inner)
        .unwrap_or_else(|| panic!("no selector in {query}"));
    inner
        .split(',')
        .map(|m| {
            let (k, v) = m.split_once('=').unwrap_or_else(|| panic!("matcher {m}"));
            (k.trim().to_owned(), v.trim().trim_matches('"').to_owned())
        })
        .collect()
}

#[test]
fn pdb_service_monitor_and_scaler_select_the_workload() {
    for (label, docs) in renderings() {
        println!("{label}");
        objects_select_the_workload(&docs);
    }
}

fn objects_select_the_workload(docs: &[Value]) {
    let workloads = workloads(docs);
    assert_eq!(workloads.len(), 1, "one workload");
    let w = workloads[0];
    let kind = w["kind"].as_str().unwrap();
    let selector = str_map(&w["spec"]["selector"]["matchLabels"]);
    let pod = &w["spec"]["template"];
    let pod_labels = str_map(&pod["metadata"]["labels"]);
    assert!(selects(&selector, &pod_labels), "workload selects its pods");

    let pdb = one(docs, "PodDisruptionBudget");
    assert_eq!(
        str_map(&pdb["spec"]["selector"]["matchLabels"]),
        selector,
        "the PDB covers the workload's pods"
    );
    assert!(
        !pdb["spec"]["maxUnavailable"].is_null() || !pdb["spec"]["minAvailable"].is_null(),
        "the PDB bounds disruptions"
    );
    // An unready pod never blocks a node drain.
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");

    // Every spread constraint counts this workload's pods.
    let spread = pod["spec"]["topologySpreadConstraints"]
        .as_sequence()
        .expect("topologySpreadConstraints");
    assert!(!spread.is_empty());
    for c in spread {
        assert!(
            selects(&str_map(&c["labelSelector"]["matchLabels"]), &pod_labels),
            "{c:?}"
        );
        assert!(c["maxSkew"].as_u64().is_some_and(|s| s >= 1), "{c:?}");
    }

    // The pods run as the ServiceAccount the rendering creates, without an API token.
    let account = one(docs, "ServiceAccount");
    assert_eq!(
        pod["spec"]["serviceAccountName"].as_str(),
        Some(name(account))
    );
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);

    let service = one(docs, "Service");
    assert!(selects(&str_map(&service["spec"]["selector"]), &pod_labels));
    let container_ports: Vec<&str> = pod["spec"]["containers"][0]["ports"]
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

    let monitor = one(docs, "ServiceMonitor");
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

    for policy in of_kind(docs, "NetworkPolicy") {
        assert!(selects(
            &str_map(&policy["spec"]["podSelector"]["matchLabels"]),
            &pod_labels
        ));
        for rule in policy["spec"]["ingress"].as_sequence().unwrap() {
            for p in rule["ports"].as_sequence().unwrap() {
                assert!(
                    container_ports.contains(&p["port"].as_str().unwrap_or_default()),
                    "ingress to a named container port: {p:?}"
                );
            }
        }
        let types: Vec<&str> = policy["spec"]["policyTypes"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if types.contains(&"Egress") {
            // With egress restricted, name resolution stays open.
            let dns = policy["spec"]["egress"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|r| {
                    r["to"].is_null()
                        && r["ports"]
                            .as_sequence()
                            .is_some_and(|ps| ps.iter().any(|p| p["port"] == 53))
                });
            assert!(dns, "egress allows DNS");
        }
    }

    let scalers = of_kind(docs, "ScaledObject");
    if scalers.is_empty() {
        assert!(
            w["spec"]["replicas"].as_u64().is_some_and(|r| r >= 1),
            "without an autoscaler the workload sets its replicas"
        );
        return;
    }
    assert_eq!(scalers.len(), 1);
    let scaler = scalers[0];
    // KEDA owns the count: a fixed count in the workload would undo it at every apply.
    assert!(w["spec"]["replicas"].is_null(), "no replicas beside KEDA");
    let target = &scaler["spec"]["scaleTargetRef"];
    assert_eq!(target["kind"], kind);
    assert_eq!(target["name"].as_str(), Some(name(w)));
    let max = scaler["spec"]["maxReplicaCount"].as_u64().expect("a cap");
    let min = scaler["spec"]["minReplicaCount"].as_u64().unwrap_or(0);
    assert!(min >= 1 && max >= min, "{min}..{max}");
    let lag = tessel_kafka::telemetry::metrics::CONSUMER_LAG;
    let queries: Vec<&str> = scaler["spec"]["triggers"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|t| t["metadata"]["query"].as_str())
        .filter(|q| q.contains(lag))
        .collect();
    assert_eq!(queries.len(), 1, "scales on {lag}");
    // The lag of this release only: the namespace it is installed in and its region.
    let m = matchers(queries[0]);
    assert_eq!(m.get("namespace").map(String::as_str), Some(NAMESPACE));
    assert_eq!(m.get("region"), pod_labels.get("region"));
    assert!(m.contains_key("connection"), "{m:?}");
    // The optional trigger on the lag in seconds selects the same series' owners, and follows
    // the age itself (Value), not the age shared among the replicas.
    let seconds = tessel_kafka::telemetry::metrics::CONSUMER_LAG_SECONDS;
    for t in scaler["spec"]["triggers"].as_sequence().unwrap() {
        let Some(q) = t["metadata"]["query"]
            .as_str()
            .filter(|q| q.contains(seconds))
        else {
            continue;
        };
        assert_eq!(t["metricType"].as_str(), Some("Value"), "{q}");
        let s = matchers(q);
        assert_eq!(
            (s.get("namespace"), s.get("region"), s.get("connection")),
            (m.get("namespace"), m.get("region"), m.get("connection")),
            "{q}"
        );
    }
}

#[test]
fn the_optional_rendering_turns_on_keda_network_policy_and_irsa() {
    let docs = optional_rendering();
    assert_eq!(of_kind(&docs, "ScaledObject").len(), 1);
    let triggers = one(&docs, "ScaledObject")["spec"]["triggers"]
        .as_sequence()
        .unwrap()
        .clone();
    let thresholds: Vec<(&str, &str)> = triggers
        .iter()
        .map(|t| {
            let q = t["metadata"]["query"].as_str().unwrap();
            let metric = if q.contains(tessel_kafka::telemetry::metrics::CONSUMER_LAG_SECONDS) {
                "seconds"
            } else {
                "messages"
            };
            (metric, t["metadata"]["threshold"].as_str().unwrap())
        })
        .collect();
    assert_eq!(thresholds, [("messages", "5000"), ("seconds", "300")]);
    assert_eq!(of_kind(&docs, "NetworkPolicy").len(), 1);
    let account = one(&docs, "ServiceAccount");
    let role = account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
        .as_str()
        .expect("an IRSA role");
    assert!(role.starts_with("arn:aws:iam::"), "{role}");
    // The Secret the chart creates holds every file the config reads from the mount.
    let w = workloads(&docs)[0];
    let pod = &w["spec"]["template"]["spec"];
    let secret = one(&docs, "Secret");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| !v["secret"].is_null())
        .expect("a secret volume");
    assert_eq!(volume["secret"]["secretName"].as_str(), Some(name(secret)));
    let mount = pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the secret volume is mounted");
    let dir = format!("{}/", mount["mountPath"].as_str().unwrap());
    let (text, _) = config_and_container(&docs);
    let read: Vec<&str> = text
        .split('"')
        .filter_map(|part| part.strip_prefix(dir.as_str()))
        .collect();
    assert!(!read.is_empty(), "the config reads secret files");
    let keys = str_map(&secret["stringData"]);
    for file in read {
        assert!(keys.contains_key(file), "{file} is in the Secret");
    }
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
    let mut checksums = Vec::new();
    for (label, docs) in renderings() {
        println!("{label}");
        checksums.push(checksum_is_the_configs(&docs));
        grace_outlives_the_drain(&docs);
    }
    // Another config (the drain made longer) gives another checksum: a rollout.
    let (_, docs) = &renderings()[0];
    let (text, _) = config_and_container(docs);
    let changed = text.replace("drain_timeout_ms = 30000", "drain_timeout_ms = 45000");
    assert_ne!(changed, text);
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    let yaml = serde_yaml::to_string(&serde_yaml::Mapping::from_iter([(
        Value::from("config"),
        Value::from(changed.as_str()),
    )]))
    .unwrap();
    std::fs::write(&values, yaml).unwrap();
    let docs = render(&["-f", values.to_str().unwrap()]);
    assert_eq!(config_and_container(&docs).0, changed);
    let new = checksum_is_the_configs(&docs);
    grace_outlives_the_drain(&docs);
    assert!(!checksums.contains(&new), "{new} for a changed config");
}

/// checksum/config is the sha256 of the ConfigMap's config.toml; returns it.
fn checksum_is_the_configs(docs: &[Value]) -> String {
    let (text, _) = config_and_container(docs);
    let w = workloads(docs)[0];
    let checksum = hex::encode(Sha256::digest(text.as_bytes()));
    assert_eq!(
        w["spec"]["template"]["metadata"]["annotations"]["checksum/config"].as_str(),
        Some(checksum.as_str()),
        "checksum/config must be the sha256 of the ConfigMap's config.toml"
    );
    checksum
}

/// The pods' grace period outlasts every connection's drain.
fn grace_outlives_the_drain(docs: &[Value]) {
    let (text, _) = config_and_container(docs);
    let w = workloads(docs)[0];
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
    for (label, docs) in renderings() {
        println!("{label}");
        joins_with_its_own_group_instance_id(&docs);
    }
    // Two connections, one with a dash in its name, each with static membership.
    let values = repo().join(EXTERNAL_VALUES);
    let docs = render(&["-f", values.to_str().unwrap()]);
    let (text, _) = config_and_container(&docs);
    let config: toml::Table = text.parse().unwrap();
    assert!(config["connections"].as_table().unwrap().len() > 1);
    joins_with_its_own_group_instance_id(&docs);
}

fn joins_with_its_own_group_instance_id(docs: &[Value]) {
    let (text, container) = config_and_container(docs);
    let w = workloads(docs)[0];
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
        let client = tessel_kafka::consumer::consumer_config(cname, c);
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
