//! The Helm chart in `deploy/helm/tessel-kafka` and the plain manifests rendered from it
//! (`deploy/kubernetes/`), parsed and checked for what a cluster would enforce or an operator
//! would rely on: the Pod Security "restricted" profile, probes and resources on every
//! container, a PodDisruptionBudget, Service, ServiceMonitor or PodMonitor, PrometheusRule,
//! KEDA ScaledObject, NetworkPolicy and ServiceAccount that match the workload, config and
//! Secret changes reloaded in place (or rolled, as a switch), and the region's settings and
//! static membership from the pod name through the environment overlay.
//!
//! Each check runs on the renderings CI validates (`scripts/chart-check`): the default values
//! in a cluster with the Prometheus Operator's CRDs, another release name with
//! `fullnameOverride` and a PodMonitor (`ci/external-values.yaml`), KEDA with a NetworkPolicy,
//! IRSA and a chart-made Secret (`ci/keda-netpol-irsa-values.yaml`), and region placement with
//! KEDA on the region's load (`ci/region-keda-values.yaml`); the last two in a namespace of
//! their own. The chart is rendered by `scripts/chart-check template` (Helm, a Go module,
//! installed once into the cache); no cluster or broker needed.
//!
//! The shipped queries (alert rules, the rendered PrometheusRules, the dashboard, the KEDA
//! triggers) are checked to name only metrics the daemon emits and to select the job the
//! chart's monitors give every target, and the rules are unit-tested with `promtool test
//! rules` on series labelled as those monitors label them.

mod promql;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde::Deserialize as _;
use serde_yaml::Value;
use sha2::{Digest, Sha256};
use tessel_kafka::config::Config;
use tessel_kafka::telemetry::metrics;

use crate::support::repo;

const MANIFEST: &str = "deploy/kubernetes/tessel-kafka.yaml";
const MONITORING_MANIFEST: &str = "deploy/kubernetes/tessel-kafka-monitoring.yaml";
const CHART: &str = "deploy/helm/tessel-kafka";
const OPTIONAL_VALUES: &str = "deploy/helm/tessel-kafka/ci/keda-netpol-irsa-values.yaml";
/// Values with things managed elsewhere, a name of its own and two connections.
const EXTERNAL_VALUES: &str = "deploy/helm/tessel-kafka/ci/external-values.yaml";
/// Region placement with KEDA on the region's load.
const REGION_VALUES: &str = "deploy/helm/tessel-kafka/ci/region-keda-values.yaml";
const ALERTS: &str = "deploy/prometheus/alerts.yml";
const DASHBOARD: &str = "deploy/grafana/tessel-kafka.json";
/// The namespace the optional renderings are made for.
const NAMESPACE: &str = "payments-eu";
/// The release name of the rendering with external values (its fullnameOverride differs).
const OTHER_RELEASE: &str = "payments";
/// The job the alert rules and the dashboard select `up` by.
const JOB: &str = "tessel-kafka";
/// A cluster with the Prometheus Operator's CRDs, as `helm install` finds it.
const OPERATOR_APIS: [&str; 6] = [
    "--api-versions",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PodMonitor",
    "--api-versions",
    "monitoring.coreos.com/v1/PrometheusRule",
];

fn parse(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every document of a plain manifest.
fn documents(path: &str) -> Vec<Value> {
    parse(&std::fs::read_to_string(repo().join(path)).expect("manifest"))
}

/// `helm template` of the chart (release tessel-kafka) with these arguments.
fn render(args: &[&str]) -> Vec<Value> {
    parse(&render_text(args).expect("helm template"))
}

/// `helm template` with these arguments (`--release NAME` first for another release): its
/// output, or its error.
fn render_text(args: &[&str]) -> Result<String, String> {
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
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A values file of the chart, as an argument.
fn values(path: &str) -> String {
    repo().join(path).display().to_string()
}

/// `args` and the Prometheus Operator's CRDs.
fn with_operator(args: &[&str]) -> Vec<String> {
    args.iter()
        .copied()
        .chain(OPERATOR_APIS)
        .map(str::to_owned)
        .collect()
}

/// One rendering CI validates: what it is, the release and namespace it is made for, and its
/// documents.
struct Rendering {
    label: &'static str,
    release: &'static str,
    namespace: &'static str,
    docs: Vec<Value>,
}

fn rendering(
    label: &'static str,
    release: &'static str,
    namespace: &'static str,
    args: &[&str],
) -> Rendering {
    let mut all = vec!["--release", release, "--namespace", namespace];
    all.extend_from_slice(args);
    let args = with_operator(&all);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Rendering {
        label,
        release,
        namespace,
        docs: render(&args),
    }
}

/// The chart with its optional parts on, in [`NAMESPACE`].
fn optional_rendering() -> Vec<Value> {
    let v = values(OPTIONAL_VALUES);
    rendering("optional", "tessel-kafka", NAMESPACE, &["-f", &v]).docs
}

/// The renderings every check runs on, in a cluster with the Prometheus Operator's CRDs.
fn renderings() -> Vec<Rendering> {
    let (optional, external, region) = (
        values(OPTIONAL_VALUES),
        values(EXTERNAL_VALUES),
        values(REGION_VALUES),
    );
    vec![
        rendering("defaults", "tessel-kafka", "default", &[]),
        rendering("external", OTHER_RELEASE, "payments", &["-f", &external]),
        rendering("optional", "tessel-kafka", NAMESPACE, &["-f", &optional]),
        rendering("region", "tessel-kafka", NAMESPACE, &["-f", &region]),
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
fn the_plain_manifests_are_the_charts_default_rendering() {
    let manifest = documents(MANIFEST);
    assert_eq!(
        manifest,
        render(&["--skip-tests"]),
        "{MANIFEST} differs from the chart's default rendering: run scripts/render-manifests"
    );
    let monitoring = documents(MONITORING_MANIFEST);
    let mut args = with_operator(&["--skip-tests"]);
    args.extend(
        ["--show-only", "templates/servicemonitor.yaml"]
            .into_iter()
            .chain(["--show-only", "templates/prometheusrule.yaml"])
            .map(str::to_owned),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        monitoring,
        render(&args),
        "{MONITORING_MANIFEST} differs from the chart's rendering: run scripts/render-manifests"
    );
    let kinds: BTreeSet<&str> = monitoring
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["PrometheusRule", "ServiceMonitor"]));
    // No object names a namespace: `kubectl apply -n NS` puts it anywhere.
    for d in manifest.iter().chain(&monitoring) {
        assert!(d["metadata"]["namespace"].is_null(), "{}", name(d));
    }
}

#[test]
fn every_container_meets_the_restricted_pod_security_profile() {
    for r in renderings() {
        println!("{}", r.label);
        restricted_profile_probes_and_resources(&r.docs);
    }
}

/// The restricted profile on the workload's pods and on bare pods (the `helm test` pod);
/// probes on the workload's containers; resources on every container.
fn restricted_profile_probes_and_resources(docs: &[Value]) {
    let workloads = workloads(docs);
    assert!(!workloads.is_empty(), "a Deployment or StatefulSet");
    let pods = workloads
        .iter()
        .map(|w| (&w["spec"]["template"]["spec"], true))
        .chain(
            of_kind(docs, "Pod")
                .into_iter()
                .map(|p| (&p["spec"], false)),
        );
    for (pod, serves) in pods {
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
            if !serves
                || pod["initContainers"]
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
        }
    }
}

#[test]
fn pdb_service_monitor_and_scaler_select_the_workload() {
    for r in renderings() {
        println!("{}", r.label);
        objects_select_the_workload(&r);
    }
}

/// The job Prometheus gives this rendering's targets: its monitor's `jobLabel`, read from the
/// Service's labels (ServiceMonitor) or the pods' (PodMonitor), as the Prometheus Operator
/// does. Without a `jobLabel` a ServiceMonitor's job would be the Service's name (the release
/// name), which the rules cannot know.
fn job_of(docs: &[Value]) -> String {
    let w = workloads(docs)[0];
    let pod_labels = str_map(&w["spec"]["template"]["metadata"]["labels"]);
    let monitors: Vec<&Value> = of_kind(docs, "ServiceMonitor")
        .into_iter()
        .chain(of_kind(docs, "PodMonitor"))
        .collect();
    assert_eq!(monitors.len(), 1, "one ServiceMonitor or PodMonitor");
    let monitor = monitors[0];
    let label = monitor["spec"]["jobLabel"]
        .as_str()
        .expect("the monitor names its jobLabel");
    let labels = if monitor["kind"] == "ServiceMonitor" {
        str_map(&one(docs, "Service")["metadata"]["labels"])
    } else {
        pod_labels
    };
    labels
        .get(label)
        .unwrap_or_else(|| panic!("the monitored objects have no label {label}"))
        .clone()
}

fn objects_select_the_workload(r: &Rendering) {
    let docs = &r.docs;
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

    // The pods run as the ServiceAccount the rendering creates (or the one named), without
    // an API token.
    let account = pod["spec"]["serviceAccountName"].as_str().unwrap();
    if let Some(created) = of_kind(docs, "ServiceAccount").first() {
        assert_eq!(account, name(created));
    } else {
        assert_ne!(account, "default", "an existing ServiceAccount is named");
    }
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

    // A ServiceMonitor selects the Service and its port, a PodMonitor the pods and theirs.
    for monitor in of_kind(docs, "ServiceMonitor") {
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
    }
    for monitor in of_kind(docs, "PodMonitor") {
        assert!(selects(
            &str_map(&monitor["spec"]["selector"]["matchLabels"]),
            &pod_labels
        ));
        for e in monitor["spec"]["podMetricsEndpoints"]
            .as_sequence()
            .unwrap()
        {
            assert!(
                container_ports.contains(&e["port"].as_str().unwrap()),
                "{e:?}"
            );
            assert_eq!(e["path"], "/metrics");
        }
    }
    // Whatever the release is called, the job is the one the rules select.
    assert_eq!(job_of(docs), JOB, "{}", r.label);
    // The region the dashboard, the alerts and KEDA filter by comes from this pod label.
    for monitor in of_kind(docs, "ServiceMonitor")
        .into_iter()
        .chain(of_kind(docs, "PodMonitor"))
    {
        let copied: Vec<&str> = monitor["spec"]["podTargetLabels"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(copied, ["region"]);
        assert!(pod_labels.contains_key("region"));
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
    // Every trigger selects this release's series (its namespace and region), of every
    // connection: none is named. With region placement the first scales on the region's
    // load, else on the lag in messages.
    let (text, _) = config_and_container(docs);
    let placement = text.contains("[region.kafka]");
    let triggers = scaler["spec"]["triggers"].as_sequence().unwrap();
    for (i, t) in triggers.iter().enumerate() {
        let q = t["metadata"]["query"].as_str().expect("a query");
        let found = promql::selectors(q);
        assert_eq!(found.len(), 1, "{q}");
        let s = &found[0];
        assert_eq!(s.matched("namespace", "="), Some(r.namespace), "{q}");
        assert_eq!(
            s.matched("region", "=").map(str::to_owned),
            pod_labels.get("region").cloned(),
            "{q}"
        );
        assert!(
            s.matchers.iter().all(|m| m.label != "connection"),
            "no connection named: {q}"
        );
        let want = match (i, placement) {
            (0, true) => metrics::REGION_LOAD,
            (0, false) => metrics::CONSUMER_LAG,
            _ => metrics::CONSUMER_LAG_SECONDS,
        };
        assert_eq!(s.metric, want, "{q}");
        // The optional trigger on the lag in seconds follows the age itself (Value), not
        // the age shared among the replicas.
        if i > 0 {
            assert_eq!(t["metricType"].as_str(), Some("Value"), "{q}");
        }
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

/// The pod template's annotations.
fn pod_annotations(docs: &[Value]) -> BTreeMap<String, String> {
    str_map(&workloads(docs)[0]["spec"]["template"]["metadata"]["annotations"])
}

/// The chart's default rendering with `config` in place of its config, and `extra` values.
fn render_with_config(config: &str, extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("values.yaml");
    let yaml = serde_yaml::to_string(&serde_yaml::Mapping::from_iter([(
        Value::from("config"),
        Value::from(config),
    )]))
    .unwrap();
    std::fs::write(&path, yaml).unwrap();
    let mut args = vec!["-f", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    render(&args)
}

/// A config change reaches the running pods through the ConfigMap, where the daemons reload
/// it: the pod template stays the same (no rollout), and the pods outlive every drain. A
/// change a reload cannot apply ([server], [log], [otlp], [region]) rolls them, and so does
/// every change with rollOnChange.config (checksum/config is then the sha256 of config.toml).
#[test]
fn config_changes_are_reloaded_and_only_restart_settings_roll_the_pods() {
    for r in renderings() {
        println!("{}", r.label);
        grace_outlives_the_drain(&r.docs);
    }
    let docs = render(&[]);
    let (text, _) = config_and_container(&docs);
    let template = |docs: &[Value]| workloads(docs)[0]["spec"]["template"].clone();
    let annotations = pod_annotations(&docs);
    assert!(
        annotations.contains_key("checksum/restart"),
        "{annotations:?}"
    );
    assert!(
        !annotations.contains_key("checksum/config"),
        "{annotations:?}"
    );

    // A connection's setting: reloaded, the pods stay.
    let drain = text.replace("drain_timeout_ms = 30000", "drain_timeout_ms = 20000");
    assert_ne!(drain, text);
    let changed = render_with_config(&drain, &[]);
    assert_eq!(config_and_container(&changed).0, drain);
    assert_eq!(
        template(&changed),
        template(&docs),
        "no rollout for a reloadable change"
    );
    // The log's format: only a restart applies it.
    let log = text.replace("format = \"json\"", "format = \"text\"");
    assert_ne!(log, text);
    let rolled = pod_annotations(&render_with_config(&log, &[]));
    assert_ne!(rolled["checksum/restart"], annotations["checksum/restart"]);

    // rollOnChange.config: every change rolls, by the checksum of the file.
    let roll = ["--set", "rollOnChange.config=true"];
    for text in [&text, &drain] {
        let docs = render_with_config(text, &roll);
        let checksum = hex::encode(Sha256::digest(text.as_bytes()));
        assert_eq!(
            pod_annotations(&docs).get("checksum/config"),
            Some(&checksum),
            "checksum/config must be the sha256 of the ConfigMap's config.toml"
        );
        grace_outlives_the_drain(&docs);
    }
}

/// A Secret's change reaches the running pods through the mount (mounted whole, no subPath),
/// where the daemons reload it. rollOnChange.secrets rolls them instead: by the checksum of
/// a Secret the chart makes, by Stakater Reloader's annotation for an existing one.
#[test]
fn secret_changes_are_reloaded_or_rolled_as_a_switch() {
    let docs = optional_rendering();
    let (_, container) = config_and_container(&docs);
    for m in container["volumeMounts"].as_sequence().unwrap() {
        assert!(m["subPath"].is_null(), "{m:?} would never be updated");
    }
    assert!(!pod_annotations(&docs).contains_key("checksum/secrets"));
    let optional = values(OPTIONAL_VALUES);
    let rolled = render(&["-f", &optional, "--set", "rollOnChange.secrets=true"]);
    let files = &one(&rolled, "Secret")["stringData"];
    assert_eq!(
        pod_annotations(&rolled).get("checksum/secrets"),
        Some(&hex::encode(Sha256::digest(
            serde_json::to_string(&serde_json::json!({
                "dispatcher-token": files["dispatcher-token"].as_str().unwrap(),
                "kafka-password": files["kafka-password"].as_str().unwrap(),
            }))
            .unwrap()
            .as_bytes()
        )))
    );
    let external = values(EXTERNAL_VALUES);
    let docs = render(&["--release", OTHER_RELEASE, "-f", &external]);
    let w = workloads(&docs)[0];
    let secret = str_map(&w["metadata"]["annotations"]);
    assert_eq!(
        secret
            .get("secret.reloader.stakater.com/reload")
            .map(String::as_str),
        Some("payments-connector-secrets")
    );
    let volume = w["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| !v["secret"].is_null())
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "payments-connector-secrets");
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

/// The pod's environment for pod `<workload>-<ordinal>`, as the kubelet makes it.
fn pod_env(docs: &[Value], ordinal: u32) -> BTreeMap<String, String> {
    let (_, container) = config_and_container(docs);
    let w = workloads(docs)[0];
    let pod_name = format!("{}-{ordinal}", name(w));
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
    vars
}

/// The config each pod loads: the ConfigMap's file with its secret files (in a temporary
/// directory) and the pod's environment.
fn pod_config(docs: &[Value], text: &str, ordinal: u32) -> Config {
    let secrets = tempfile::tempdir().unwrap();
    for f in [
        "kafka-password",
        "dispatcher-token",
        "region-kafka-password",
    ] {
        std::fs::write(secrets.path().join(f), "x").unwrap();
    }
    let text = text.replace(
        "/run/secrets/tessel-kafka",
        &secrets.path().display().to_string(),
    );
    let env: Vec<(String, String)> = pod_env(docs, ordinal)
        .into_iter()
        .filter(|(k, _)| k.starts_with("TESSEL_KAFKA__"))
        .collect();
    assert!(!env.is_empty(), "the pod sets an override");
    Config::from_toml_with_env(&text, env).expect("the pod's config loads")
}

#[test]
fn each_pod_is_a_replica_of_its_region_and_joins_with_its_own_group_instance_id() {
    for r in renderings() {
        println!("{}", r.label);
        replica_of_its_region(&r.docs);
    }
}

fn replica_of_its_region(docs: &[Value]) {
    let (text, _) = config_and_container(docs);
    let w = workloads(docs)[0];
    let labels = str_map(&w["spec"]["template"]["metadata"]["labels"]);
    let region = &labels["region"];
    let file: toml::Table = text.parse().unwrap();
    for ordinal in [0, 1] {
        let pod = format!("{}-{ordinal}", name(w));
        let config = pod_config(docs, &text, ordinal);
        // The pod is a replica named after itself, in the chart's region, reachable by its
        // name under the headless Service.
        assert_eq!(&config.region.name, region);
        assert_eq!(config.region.replica_id(), pod);
        assert_eq!(
            config.region.advertise_url(9464),
            format!("http://{pod}.{}:9464", name(one(docs, "Service")))
        );
        // Every consuming connection, none named in values, joins as <region>-<pod>.
        for (cname, c) in &config.connections {
            let want = format!("{region}-{pod}");
            assert_eq!(
                c.kafka.get("group.instance.id"),
                Some(&want),
                "{cname}: static membership"
            );
            let client = tessel_kafka::consumer::consumer_config(cname, c);
            assert_eq!(client.get("group.instance.id"), Some(want.as_str()));
        }
        // A connection added later (a reload) gets it too.
        let added = format!(
            "{text}\n[connections.added-later.kafka]\n\"bootstrap.servers\" = \"b:9092\"\n\"group.id\" = \"g\"\n[connections.added-later.triggers.t]\ntopics = [\"t\"]\nworkflow = \"w\"\ndispatcher = {{ url = \"https://api.tessel.example/v1/runs\" }}\n"
        );
        let config = pod_config(docs, &added, ordinal);
        assert_eq!(
            config.connections["added-later"]
                .kafka
                .get("group.instance.id"),
            Some(&format!("{region}-{pod}"))
        );
    }
    assert!(!file["connections"].as_table().unwrap().is_empty());
}

/// The renderings cover what the values files promise: two connections, and region
/// placement.
#[test]
fn the_value_sets_cover_several_connections_and_region_placement() {
    let external = values(EXTERNAL_VALUES);
    let docs = render(&["--release", OTHER_RELEASE, "-f", &external]);
    let (text, _) = config_and_container(&docs);
    let config: toml::Table = text.parse().unwrap();
    assert!(config["connections"].as_table().unwrap().len() > 1);
    let region = values(REGION_VALUES);
    let docs = render(&["-f", &region]);
    let (text, _) = config_and_container(&docs);
    assert!(text.contains("[region.kafka]"), "{text}");
}

/// Values the chart no longer has, and combinations that cannot work, fail the rendering
/// with the reason, instead of rendering something else.
#[test]
fn removed_values_and_impossible_combinations_are_refused_with_the_reason() {
    for (args, reason) in [
        (
            vec!["--set", "staticMembership.connections={orders}"],
            "staticMembership.connections was removed",
        ),
        (
            vec!["--set", "keda.connection=orders"],
            "keda.connection was removed",
        ),
        (
            vec!["--set", "podMonitor.enabled=true"],
            "serviceMonitor.enabled and podMonitor.enabled",
        ),
        (vec!["--set", "region=eu west"], "region \"eu west\""),
        (
            vec!["--set", "config=[region]\nname = \"us-east-1\""],
            "config sets region.name \"us-east-1\"",
        ),
        (vec!["--set", "config=not toml ["], "config: not valid TOML"),
        (
            vec![
                "--set",
                "config=[connections.a.kafka]\n\"group.instance.id\" = \"fixed\"",
            ],
            "connection a sets group.instance.id",
        ),
    ] {
        let err = render_text(&args).expect_err(&format!("{args:?} renders"));
        assert!(err.contains(reason), "{args:?}: {err}");
    }
}

/// ServiceMonitor, PodMonitor and PrometheusRule render only where the cluster has their
/// CRDs: `helm install` on a cluster without the Prometheus Operator does not fail on them.
#[test]
fn prometheus_operator_objects_render_only_where_their_crds_exist() {
    let kinds = |docs: &[Value]| -> BTreeSet<String> {
        docs.iter()
            .filter(|d| {
                d["apiVersion"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("monitoring.coreos.com/"))
            })
            .map(|d| d["kind"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(kinds(&render(&[])).is_empty(), "no CRDs, no objects");
    let all = with_operator(&[]);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    assert_eq!(
        kinds(&render(&all)),
        BTreeSet::from(["PrometheusRule".to_owned(), "ServiceMonitor".to_owned()])
    );
    // Only the ServiceMonitor's CRD: no PrometheusRule.
    assert_eq!(
        kinds(&render(&[
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor"
        ])),
        BTreeSet::from(["ServiceMonitor".to_owned()])
    );
    let external = values(EXTERNAL_VALUES);
    let mut args = vec!["--release", OTHER_RELEASE, "-f", &external];
    args.extend_from_slice(&all);
    assert_eq!(
        kinds(&render(&args)),
        BTreeSet::from(["PodMonitor".to_owned(), "PrometheusRule".to_owned()])
    );
    // The rendering of a cluster without the CRDs is otherwise complete.
    let docs = render(&[]);
    for kind in ["StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"] {
        let _ = one(&docs, kind);
    }
}

/// The alert rules of a rendered PrometheusRule are deploy/prometheus/alerts.yml (each
/// runbook_url at prometheusRule.runbookUrl), and pass `promtool check rules`.
#[test]
fn the_prometheus_rule_is_the_alert_file_and_passes_promtool() {
    let text = std::fs::read_to_string(repo().join(ALERTS)).unwrap();
    let copy = std::fs::read_to_string(repo().join(CHART).join("files/alerts.yml")).unwrap();
    assert_eq!(
        copy, text,
        "the chart's copy is stale: run scripts/render-manifests"
    );
    let url = "https://runbooks.example.org/tessel-kafka.md";
    let mut args = with_operator(&["--set"]);
    args.insert(1, format!("prometheusRule.runbookUrl={url}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let docs = render(&args);
    let rule = one(&docs, "PrometheusRule");
    let want: Value = serde_yaml::from_str(
        &text.replace("https://tessel.example/tessel-kafka/docs/runbook.md", url),
    )
    .unwrap();
    assert_eq!(rule["spec"], want);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yml");
    std::fs::write(&path, serde_yaml::to_string(&rule["spec"]).unwrap()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool (scripts/deps installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `promtool test rules` on deploy/prometheus/alerts-test.yml: every alert fires on the series
/// it is about, labelled as the chart's monitors label them (job tessel-kafka for a release
/// with another name), and stays quiet otherwise. Run on a copy of the rules without their
/// annotations, which promtool would otherwise compare word for word.
#[test]
fn every_alert_fires_on_its_series_as_the_charts_monitors_label_them() {
    let mut rules: Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo().join(ALERTS)).unwrap()).unwrap();
    let mut names = BTreeSet::new();
    for group in rules["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            let _ = names.insert(rule["alert"].as_str().unwrap().to_owned());
            let _ = rule.as_mapping_mut().unwrap().remove("annotations");
        }
    }
    let tests = std::fs::read_to_string(repo().join("deploy/prometheus/alerts-test.yml")).unwrap();
    for alert in &names {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "alerts-test.yml does not test {alert}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("alerts.yml"),
        serde_yaml::to_string(&rules).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("alerts-test.yml"), tests).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules", "alerts-test.yml"])
        .current_dir(dir.path())
        .output()
        .expect("promtool (scripts/deps installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `metric` is one the daemon emits (histograms through their series), or `up`,
/// which Prometheus makes for every target.
fn emitted(metric: &str) -> bool {
    metric == "up"
        || metrics::INVENTORY.iter().any(|(n, kind, _)| match kind {
            metrics::Kind::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| metric.strip_suffix(s) == Some(*n)),
            metrics::Kind::Counter | metrics::Kind::Gauge => metric == *n,
        })
}

/// Every alert expression (the file's and each rendered PrometheusRule's), every dashboard
/// panel and variable query, and every KEDA query names only metrics the daemon emits, and
/// selects by what the chart controls: `up` by the job the rendering's monitor gives every
/// target (tessel-kafka, whatever the release is called), never by the release's or the
/// Service's name; the dashboard's series by its namespace and region variables.
#[test]
fn every_alert_and_panel_query_names_an_emitted_metric_and_selects_the_charts_label() {
    let mut queries: Vec<(String, String)> = Vec::new();
    let rules: Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo().join(ALERTS)).unwrap()).unwrap();
    let alert_exprs = |rules: &Value, from: &str| -> Vec<(String, String)> {
        rules["groups"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
            .map(|r| {
                (
                    format!("{from} {}", r["alert"].as_str().unwrap()),
                    r["expr"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    queries.extend(alert_exprs(&rules, ALERTS));
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join(DASHBOARD)).unwrap()).unwrap();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            panels += 1;
            queries.push((
                format!("panel {}", panel["title"]),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    assert!(panels >= 20, "{panels} panel queries");
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = v["definition"].as_str() {
            // label_values(<selector>, <label>)
            let selector = definition
                .strip_prefix("label_values(")
                .and_then(|d| d.rsplit_once(", "))
                .map(|(s, _)| s)
                .unwrap_or_else(|| panic!("{definition}"));
            queries.push((format!("variable {}", v["name"]), selector.to_owned()));
        }
    }

    let mut up_jobs = BTreeSet::new();
    let mut checked = 0;
    let mut check = |what: &str, expr: &str, release_names: &[&str]| {
        let found = promql::selectors(expr);
        assert!(!found.is_empty(), "{what}: no selector in {expr}");
        for s in found {
            checked += 1;
            assert!(
                emitted(&s.metric),
                "{what}: {} is not emitted: {expr}",
                s.metric
            );
            for m in &s.matchers {
                assert!(
                    !["service", "pod", "container", "endpoint", "instance"]
                        .contains(&m.label.as_str()),
                    "{what}: selects by {}, which the release names: {expr}",
                    m.label
                );
                for release in release_names {
                    assert!(
                        !m.value.contains(release),
                        "{what}: selects the release's name {release}: {expr}"
                    );
                }
            }
            if s.metric == "up" {
                let job = s
                    .matched("job", "=")
                    .unwrap_or_else(|| panic!("{what}: up without its job: {expr}"));
                let _ = up_jobs.insert(job.to_owned());
            } else if what.starts_with("panel") {
                assert_eq!(s.matched("namespace", "=~"), Some("$namespace"), "{what}");
                assert_eq!(s.matched("region", "=~"), Some("$region"), "{what}");
            }
        }
    };
    for (what, expr) in &queries {
        check(what, expr, &[]);
    }
    // Each rendering's own rules and KEDA queries, by the job its monitor makes.
    for r in renderings() {
        let job = job_of(&r.docs);
        assert_eq!(job, JOB, "{}", r.label);
        let service = name(one(&r.docs, "Service")).to_owned();
        let mut names = vec![r.release, service.as_str()];
        names.retain(|n| *n != JOB);
        for rule in of_kind(&r.docs, "PrometheusRule") {
            for (what, expr) in alert_exprs(&rule["spec"], r.label) {
                check(&what, &expr, &names);
            }
        }
        for scaler in of_kind(&r.docs, "ScaledObject") {
            for t in scaler["spec"]["triggers"].as_sequence().unwrap() {
                let q = t["metadata"]["query"].as_str().unwrap();
                check(&format!("{} KEDA", r.label), q, &names);
            }
        }
    }
    assert_eq!(
        up_jobs,
        BTreeSet::from([JOB.to_owned()]),
        "every `up` selects the chart's job"
    );
    assert!(checked > 100, "{checked} selectors");
}

/// The chart's README lists every value of values.yaml (its full dotted path) with its
/// default, and documents `helm install` and `helm test`.
#[test]
fn the_chart_readme_lists_every_value() {
    let values: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join(CHART).join("values.yaml")).unwrap(),
    )
    .unwrap();
    // Objects handed to Kubernetes as they are count as one value.
    fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
        let whole = ["resources", "podSecurityContext", "securityContext"]
            .iter()
            .any(|k| prefix.rsplit('.').next() == Some(*k));
        match v.as_mapping() {
            Some(m) if !m.is_empty() && !whole => {
                for (k, v) in m {
                    let key = k.as_str().unwrap();
                    let path = if prefix.is_empty() {
                        key.to_owned()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    leaves(&path, v, out);
                }
            }
            _ => out.push(prefix.to_owned()),
        }
    }
    let mut paths = Vec::new();
    leaves("", &values, &mut paths);
    let readme = std::fs::read_to_string(repo().join(CHART).join("README.md")).unwrap();
    let listed: BTreeSet<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(k, _)| k))
        .collect();
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !listed.contains(p.as_str()))
        .collect();
    assert!(missing.is_empty(), "the chart's README lacks {missing:?}");
    let unknown: Vec<&&str> = listed
        .iter()
        .filter(|l| !paths.iter().any(|p| p == *l))
        .collect();
    assert!(
        unknown.is_empty(),
        "the chart's README lists {unknown:?}, not values"
    );
    for command in ["helm install", "helm test", "helm upgrade"] {
        assert!(readme.contains(command), "{command}");
    }
}

/// `helm test`: `tessel-kafka check` with the workload's image, config, Secret,
/// ServiceAccount and region.
#[test]
fn helm_test_checks_every_connection_with_the_releases_config_and_identity() {
    let docs = optional_rendering();
    let test = one(&docs, "Pod");
    assert_eq!(test["metadata"]["annotations"]["helm.sh/hook"], "test");
    let w = workloads(&docs)[0];
    let pod = &w["spec"]["template"]["spec"];
    let c = &test["spec"]["containers"][0];
    assert_eq!(c["image"], pod["containers"][0]["image"]);
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(args, ["check", "--config", "/etc/tessel-kafka/config.toml"]);
    assert_eq!(
        test["spec"]["serviceAccountName"],
        pod["serviceAccountName"]
    );
    assert_eq!(test["spec"]["volumes"], pod["volumes"]);
    assert_eq!(c["volumeMounts"], pod["containers"][0]["volumeMounts"]);
    assert_eq!(test["spec"]["restartPolicy"], "Never");
    assert!(of_kind(&render(&["--set", "test.enabled=false"]), "Pod").is_empty());
}

/// The image runs as the user the pod security context names.
#[test]
fn the_image_user_is_the_pods_user() {
    let docs = documents(MANIFEST);
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
