//! Operators act on a live region (issue 35): a parked key is in the status within 2 s with
//! its offset, attempts and last answer; skip dead-letters it and its key goes on, with the
//! commit past it; retry runs it at once; pause holds one trigger (no rebalance, the others
//! flow) across a restart and resume goes on; an action sent to either of two replicas takes
//! effect on the owner; tokens without the grant take no action.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};

use super::failures::read_topic;
use super::{committed, create_topic, dispatcher, reference_produce, spawn_daemon};
use crate::support::{free_port, stack, temp_config, unique, wait_for, wait_for_async};

const ACT: &str = "act-token-for-tests-0001";
const READ: &str = "read-token-for-tests-0001";
const SIDE: &str = "side-token-for-tests-0001";

/// The operator API of a daemon at `base` with `token`.
pub struct Api {
    pub base: String,
    pub token: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Self {
        Self {
            base: base.to_owned(),
            token: token.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// `GET path` with the token (None: without one): status and JSON body (null when the
    /// daemon does not answer yet).
    pub async fn get_as(&self, token: Option<&str>, path: &str) -> (u16, Value) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.get_as(Some(&self.token.clone()), path).await
    }

    /// `POST path` with `body` as `token` (None: without one).
    pub async fn post_as(&self, token: Option<&str>, path: &str, body: &Value) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("the daemon answers");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_as(Some(&self.token.clone()), path, body).await
    }

    /// The trigger's entry in the region status, once the daemon answers.
    pub async fn trigger(&self, connection: &str, trigger: &str) -> Option<Value> {
        let (status, body) = self.get("/api/v1/status").await;
        if status != 200 {
            return None;
        }
        body["connections"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == connection)?["triggers"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == trigger)
            .cloned()
    }

    /// The metrics text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }
}

/// The path of `action` on trigger `trigger` of connection `it`.
pub fn action(trigger: &str, action: &str) -> String {
    format!("/api/v1/connections/it/triggers/{trigger}/{action}")
}

/// The first sample of `name` whose labels contain `labels`.
pub fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The `[api]` and `[region]` sections of a test daemon: an act token for every trigger
/// (`oncall`), a read token (`viewer`), an act token for trigger `side` only (`side-only`).
pub fn control_sections(state_dir: &std::path::Path, replica: &str, peers: &[String]) -> String {
    let peers: Vec<String> = peers.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        r#"
[api.tokens.oncall]
token = "{ACT}"
access = "act"
connections = ["*"]
[api.tokens.viewer]
token = "{READ}"
connections = ["it"]
[api.tokens.side-only]
token = "{SIDE}"
access = "act"
connections = ["it"]
triggers = ["side"]
[region]
replica_id = "{replica}"
state_dir = "{}"
peers = [{}]
"#,
        state_dir.display(),
        peers.join(", ")
    )
}

/// A connection `it` with trigger `main` on `topic` (on_error block, `dlq` to skip into,
/// backoff of 30 s so that a retry at once is told from the next attempt) and trigger `side`
/// on `side_topic`.
pub fn two_triggers(group: &str, topic: &str, dlq: &str, side_topic: &str, url: &str) -> String {
    format!(
        r#"
[connections.it]
drain_timeout_ms = 5000
stall_after_ms = 60000
[connections.it.kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
"statistics.interval.ms" = "500"
[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf-main"
dead_letter_topic = "{dlq}"
dispatcher = {{ url = "{url}", timeout_ms = 5000 }}
retry = {{ initial_backoff_ms = 30000, max_backoff_ms = 30000 }}
[connections.it.triggers.side]
topics = ["{side_topic}"]
workflow = "wf-side"
dispatcher = {{ url = "{url}", timeout_ms = 5000 }}
"#,
        bootstrap = stack().bootstrap,
    )
}

/// Writes JSON records `{"i": i}` keyed as given to `partition` of `topic`.
pub async fn produce_to(topic: &str, partition: i32, records: &[(&str, i64)]) {
    let records: Vec<Value> = records
        .iter()
        .map(|(k, i)| json!({"key": k, "value": {"i": i}, "partition": partition}))
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "steps": [{"txn": null, "records": records}]
    }))
    .await;
}

/// The values `i` the dispatcher accepted for `workflow`, in acceptance order.
pub fn accepted_of(d: &DevDispatcher, workflow: &str) -> Vec<i64> {
    d.runs()
        .iter()
        .filter(|r| r.event["workflow"] == workflow)
        .filter_map(|r| r.event["value"]["i"].as_i64())
        .collect()
}

/// SIGTERM, and the daemon exits 0.
pub async fn terminate(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "daemon exits 0 after SIGTERM, got {status}"
    );
}

/// Kills the daemon when dropped (a failing test leaves none behind).
pub struct Killed(pub Option<Child>);

impl Killed {
    pub fn take(&mut self) -> Child {
        self.0.take().expect("the daemon")
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until the trigger has a key parked at `offset`; returns the parked key.
pub async fn parked_at(api: &Api, trigger: &str, offset: i64, within: Duration) -> Value {
    wait_for_async(
        &format!("a key parked at offset {offset}"),
        within,
        || async {
            let t = api.trigger("it", trigger).await?;
            t["parked"]
                .as_array()?
                .iter()
                .find(|k| k["offset"] == offset)
                .cloned()
        },
    )
    .await
}

#[tokio::test]
async fn a_parked_key_is_shown_skipped_to_the_dead_letters_and_retried_at_once() {
    let (topic, dlq, side) = (unique("ctl"), unique("ctl-dlq"), unique("ctl-side"));
    let group = unique("ctl-group");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let named = crate::support::key_topic(&stack().bootstrap, &topic);
    let id = |offset: i64| format!("kafka:{group}:{named}:0:{offset}");
    d.faults(|f| {
        f.fail_status = 500;
        f.fail_keys.insert(id(0));
    });
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{}{}",
        two_triggers(&group, &topic, &dlq, &side, &d.url()),
        control_sections(state.path(), "tk-0", &[])
    ));
    let _daemon = Killed(Some(spawn_daemon(&config, Stdio::inherit())));
    let api = Api::new(&format!("http://127.0.0.1:{port}"), ACT);
    // k0 at 0 fails; k1 at 1 runs; k0 at 2 waits behind 0.
    produce_to(&topic, 0, &[("k0", 0), ("k1", 1), ("k0", 2)]).await;

    // In the status within 2 s of its first failed attempt: offset, attempts, last answer.
    let first = wait_for(
        "the first attempt at offset 0",
        Duration::from_secs(60),
        || d.attempts_for(&id(0)).first().map(|(at, _)| *at),
    )
    .await;
    let key = parked_at(&api, "main", 0, Duration::from_secs(10)).await;
    let shown_after = first.elapsed();
    assert!(
        shown_after < Duration::from_secs(2),
        "parked key shown after {shown_after:?}"
    );
    eprintln!(
        "parked key in the status {} ms after its failed attempt",
        shown_after.as_millis()
    );
    assert_eq!(key["key"], "k0");
    assert_eq!(key["partition"], 0);
    assert!(key["attempts"].as_u64().unwrap() >= 1, "{key}");
    assert_eq!(key["last_status"], 500);
    assert!(
        key["last_answer"]
            .as_str()
            .unwrap()
            .contains("injected failure"),
        "{key}"
    );
    assert!(key["next_attempt_ms"].as_i64().unwrap() > key["since_ms"].as_i64().unwrap());
    assert!(
        key["next"].as_str().unwrap().contains("skip writes it to"),
        "{key}"
    );
    assert_eq!(key["owner"], "tk-0");
    wait_for(
        "k1 runs past the parked key",
        Duration::from_secs(30),
        || (accepted_of(&d, "wf-main") == [1]).then_some(()),
    )
    .await;
    let m = api.metrics().await;
    assert_eq!(
        sample(&m, "tessel_kafka_parked_keys", "trigger=\"main\""),
        Some(1.0)
    );
    // /health counts it at its next check (every second while busy).
    wait_for_async(
        "/health counts the parked key",
        Duration::from_secs(5),
        || async {
            let (_, health) = api.get("/health").await;
            (health["connections"]["it"]["parked_keys"] == 1).then_some(())
        },
    )
    .await;

    // Without the grant, no action: no token, a read token, an act token for another trigger.
    let record = json!({"topic": topic, "partition": 0, "offset": 0, "reason": "poison"});
    for (token, status) in [
        (None, 401),
        (Some(READ), 403),
        (Some(SIDE), 403),
        (Some("wrong-token-0123456789"), 401),
    ] {
        for act in ["skip", "retry", "pause"] {
            let (got, body) = api.post_as(token, &action("main", act), &record).await;
            assert_eq!(got, status, "{act} with {token:?}: {body}");
            assert!(body["error"].is_string(), "{body}");
        }
    }
    let (got, body) = api.get_as(None, "/api/v1/status").await;
    assert_eq!(got, 401, "{body}");
    let (got, viewer) = api.get_as(Some(READ), "/api/v1/status").await;
    assert_eq!(got, 200);
    assert_eq!(
        viewer["connections"][0]["triggers"][0]["parked"][0]["offset"], 0,
        "a read token sees"
    );
    let still = parked_at(&api, "main", 0, Duration::from_secs(1)).await;
    assert_eq!(still["offset"], 0, "still parked: no action was taken");
    assert_eq!(
        super::high_watermarks(&dlq, 1),
        [0],
        "nothing dead-lettered"
    );
    let t = api.trigger("it", "main").await.unwrap();
    assert_eq!(t["state"], "running");
    let m = api.metrics().await;
    assert_eq!(
        sample(&m, "tessel_kafka_operator_actions_total", "result=\"ok\""),
        None,
        "0 actions taken"
    );
    assert!(
        sample(
            &m,
            "tessel_kafka_operator_actions_total",
            "action=\"skip\",result=\"refused\""
        )
        .unwrap()
            >= 4.0
    );
    // Bad input: 4xx with a message, nothing changes.
    for (body, status) in [
        (
            json!({"topic": topic, "partition": 0, "offset": 9, "reason": "x"}),
            404,
        ),
        (json!({"topic": topic, "partition": 0, "offset": 0}), 400),
        (
            json!({"topic": topic, "partition": 0, "offset": 0, "reason": ""}),
            400,
        ),
        (
            json!({"topic": topic, "partition": "zero", "offset": 0, "reason": "x"}),
            400,
        ),
        (json!([1, 2]), 400),
    ] {
        let (got, answer) = api.post(&action("main", "skip"), &body).await;
        assert_eq!(got, status, "{body}: {answer}");
    }
    let (got, _) = api.post(&action("nope", "skip"), &record).await;
    assert_eq!(got, 404);

    // Skip: dead-lettered, the next record of k0 runs after it, the commit passes it.
    let (got, done) = api.post(&action("main", "skip"), &record).await;
    assert_eq!(got, 200, "{done}");
    assert_eq!(done["outcome"], "dead_lettered");
    assert_eq!(done["dead_letter"]["topic"], dlq.as_str());
    assert_eq!(done["replica"], "tk-0");
    let (got, again) = api.post(&action("main", "skip"), &record).await;
    assert_eq!((got, &again["already"]), (200, &json!(true)), "{again}");
    wait_for(
        "k0 at 2 runs after the skip",
        Duration::from_secs(30),
        || (accepted_of(&d, "wf-main") == [1, 2]).then_some(()),
    )
    .await;
    wait_for(
        "the commit past the skipped record",
        Duration::from_secs(30),
        || (committed(&group, &topic, 1) == [3]).then_some(()),
    )
    .await;
    let letters = read_topic(&dlq, 1).await;
    let h = &letters[0].headers;
    assert_eq!(h["tessel.stage"], "OPERATOR_SKIP");
    assert_eq!(h["tessel.error.class"], "skipped_by_operator");
    assert_eq!(h["tessel.skipped.by"], "oncall");
    assert_eq!(h["__connect.errors.offset"], "0");
    assert!(
        h["__connect.errors.exception.message"].contains("poison"),
        "{h:?}"
    );

    // Retry: parked by 500s with a 15-30 s backoff; once the dispatcher recovers, retry runs
    // it at once.
    d.faults(|f| {
        f.fail_keys.insert(id(3));
    });
    produce_to(&topic, 0, &[("k0", 3)]).await;
    let _ = parked_at(&api, "main", 3, Duration::from_secs(30)).await;
    d.faults(|f| f.fail_keys.clear());
    let asked = Instant::now();
    let (got, done) = api
        .post(
            &action("main", "retry"),
            &json!({"topic": topic, "partition": 0, "offset": 3}),
        )
        .await;
    assert_eq!((got, &done["outcome"]), (200, &json!("retrying")), "{done}");
    wait_for(
        "the retried record accepted",
        Duration::from_secs(10),
        || accepted_of(&d, "wf-main").contains(&3).then_some(()),
    )
    .await;
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "retry took {took:?}; the backoff was 15-30 s"
    );
    eprintln!(
        "retry to acceptance: {} ms (next attempt was 15-30 s away)",
        took.as_millis()
    );
    let t = wait_for_async("the parked key gone", Duration::from_secs(10), || async {
        let t = api.trigger("it", "main").await?;
        t["parked"].as_array()?.is_empty().then_some(t)
    })
    .await;
    assert!(t["last_5m"]["dead_lettered"].as_u64().unwrap() >= 1, "{t}");
    let m = api.metrics().await;
    assert_eq!(
        sample(&m, "tessel_kafka_parked_keys", "trigger=\"main\""),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &m,
            "tessel_kafka_operator_actions_total",
            "action=\"skip\",result=\"ok\""
        ),
        Some(2.0)
    );
    assert_eq!(d.repeats(), 0, "nothing ran twice");
}

#[tokio::test]
async fn pause_holds_one_trigger_across_a_restart_without_a_rebalance_and_resume_goes_on() {
    let (topic, dlq, side) = (unique("ctl-p"), unique("ctl-p-dlq"), unique("ctl-p-side"));
    let group = unique("ctl-p-group");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{}{}",
        two_triggers(&group, &topic, &dlq, &side, &d.url()),
        control_sections(state.path(), "tk-0", &[])
    ));
    let mut daemon = Killed(Some(spawn_daemon(&config, Stdio::inherit())));
    let api = Api::new(&format!("http://127.0.0.1:{port}"), ACT);
    wait_for_async(
        "both triggers assigned",
        Duration::from_secs(60),
        || async {
            let main = api.trigger("it", "main").await?;
            let side = api.trigger("it", "side").await?;
            (main["partitions"].as_array()?.len() == 1 && side["partitions"].as_array()?.len() == 1)
                .then_some(())
        },
    )
    .await;
    // One record runs and is committed first: the lag counts from the group's commit.
    produce_to(&topic, 0, &[("k", 0)]).await;
    wait_for(
        "the first record committed",
        Duration::from_secs(30),
        || (committed(&group, &topic, 1) == [1]).then_some(()),
    )
    .await;
    let assigns = |m: &str| sample(m, "tessel_kafka_rebalances_total", "kind=\"assign\"");
    let before = assigns(&api.metrics().await);

    let (got, done) = api
        .post(
            &action("main", "pause"),
            &json!({"reason": "workflow being fixed"}),
        )
        .await;
    assert_eq!(
        (got, &done["outcome"], &done["already"]),
        (200, &json!("paused"), &json!(false)),
        "{done}"
    );
    let (got, again) = api.post(&action("main", "pause"), &json!({})).await;
    assert_eq!(
        (got, &again["already"]),
        (200, &json!(true)),
        "idempotent: {again}"
    );
    let (got, _) = api
        .post_as(Some(SIDE), &action("main", "resume"), &json!({}))
        .await;
    assert_eq!(got, 403, "a token for another trigger cannot resume it");

    produce_to(&topic, 0, &(1..11).map(|i| ("k", i)).collect::<Vec<_>>()).await;
    produce_to(&side, 0, &(100..110).map(|i| ("k", i)).collect::<Vec<_>>()).await;
    wait_for(
        "the side trigger's 10 runs",
        Duration::from_secs(60),
        || (accepted_of(&d, "wf-side").len() == 10).then_some(()),
    )
    .await;
    assert_eq!(
        accepted_of(&d, "wf-main"),
        [0],
        "no run of the paused trigger"
    );
    let t = wait_for_async(
        "the paused partition reported",
        Duration::from_secs(10),
        || async {
            let t = api.trigger("it", "main").await?;
            (t["partitions"][0]["paused_reason"] == "paused by an operator").then_some(t)
        },
    )
    .await;
    assert_eq!(t["state"], "paused");
    assert_eq!(t["target"]["by"], "oncall");
    assert_eq!(t["target"]["reason"], "workflow being fixed");
    assert_eq!(assigns(&api.metrics().await), before, "no rebalance");
    wait_for_async(
        "/health names the paused trigger",
        Duration::from_secs(5),
        || async {
            let (_, health) = api.get("/health").await;
            (health["connections"]["it"]["paused_triggers"]["main"] == "workflow being fixed")
                .then_some(())
        },
    )
    .await;
    assert!(state.path().join("target-states.json").exists());

    // A restart keeps it paused.
    terminate(daemon.take()).await;
    let mut daemon = Killed(Some(spawn_daemon(&config, Stdio::inherit())));
    produce_to(&side, 0, &(110..115).map(|i| ("k", i)).collect::<Vec<_>>()).await;
    wait_for(
        "the side trigger's 15 runs after the restart",
        Duration::from_secs(60),
        || (accepted_of(&d, "wf-side").len() == 15).then_some(()),
    )
    .await;
    let t = wait_for_async(
        "the status after the restart",
        Duration::from_secs(30),
        || async {
            let t = api.trigger("it", "main").await?;
            (t["partitions"].as_array()?.len() == 1).then_some(t)
        },
    )
    .await;
    assert_eq!(t["state"], "paused", "{t}");
    // Not fetched, its lag still follows the log: the end offsets of a paused trigger's
    // partitions are queried (every 5 s, at the connection's check).
    wait_for_async(
        "the paused trigger's lag",
        Duration::from_secs(30),
        || async {
            let t = api.trigger("it", "main").await?;
            (t["lag_records"] == 10).then_some(())
        },
    )
    .await;
    assert_eq!(
        accepted_of(&d, "wf-main"),
        [0],
        "still no run of the paused trigger"
    );

    let (got, done) = api.post(&action("main", "resume"), &json!({})).await;
    assert_eq!((got, &done["outcome"]), (200, &json!("resumed")), "{done}");
    wait_for(
        "the paused trigger's 10 runs after resume",
        Duration::from_secs(60),
        || (accepted_of(&d, "wf-main") == (0..11).collect::<Vec<_>>()).then_some(()),
    )
    .await;
    wait_for("commits at the end", Duration::from_secs(30), || {
        (committed(&group, &topic, 1) == [11]).then_some(())
    })
    .await;
    terminate(daemon.take()).await;
    assert_eq!(d.repeats(), 0);
}

#[tokio::test]
async fn an_action_sent_to_either_of_two_replicas_takes_effect_on_the_owner() {
    let (topic, dlq, side) = (unique("ctl-r"), unique("ctl-r-dlq"), unique("ctl-r-side"));
    let group = unique("ctl-r-group");
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let named = crate::support::key_topic(&stack().bootstrap, &topic);
    let id = |p: i32, offset: i64| format!("kafka:{group}:{named}:{p}:{offset}");
    d.faults(|f| {
        f.fail_status = 500;
        f.fail_keys.insert(id(0, 0));
        f.fail_keys.insert(id(1, 0));
    });
    let (p1, p2) = (free_port(), free_port());
    let (s1, s2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let toml = two_triggers(&group, &topic, &dlq, &side, &d.url());
    let config = |port: u16, state: &std::path::Path, replica: &str, peer: u16| {
        temp_config(&format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}{}",
            control_sections(state, replica, &[url(peer)])
        ))
    };
    let _r1 = Killed(Some(spawn_daemon(
        &config(p1, s1.path(), "r1", p2),
        Stdio::inherit(),
    )));
    let _r2 = Killed(Some(spawn_daemon(
        &config(p2, s2.path(), "r2", p1),
        Stdio::inherit(),
    )));
    let (a1, a2) = (Api::new(&url(p1), ACT), Api::new(&url(p2), ACT));
    produce_to(&topic, 0, &[("a", 0)]).await;
    produce_to(&topic, 1, &[("b", 1)]).await;
    // Each replica owns one partition, with its key parked there; the region status of
    // either shows both, each with its owner.
    let owners = wait_for_async(
        "one parked key on each replica",
        Duration::from_secs(90),
        || async {
            let t = a1.trigger("it", "main").await?;
            let parked = t["parked"].as_array()?;
            let mut owners: Vec<(i64, String)> = parked
                .iter()
                .map(|k| {
                    (
                        k["partition"].as_i64().unwrap(),
                        k["owner"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            owners.sort();
            let distinct: std::collections::BTreeSet<&String> =
                owners.iter().map(|(_, o)| o).collect();
            (owners.len() == 2 && distinct.len() == 2).then_some(owners)
        },
    )
    .await;
    let t2 = a2.trigger("it", "main").await.unwrap();
    assert_eq!(
        t2["parked"].as_array().unwrap().len(),
        2,
        "r2 sees the region too: {t2}"
    );
    let owner_of = |p: i64| owners.iter().find(|(q, _)| *q == p).unwrap().1.clone();
    // Partition 0's key is skipped through the replica that does not own it.
    let (via, other) = if owner_of(0) == "r1" {
        (&a2, &a1)
    } else {
        (&a1, &a2)
    };
    let (got, done) = via
        .post(
            &action("main", "skip"),
            &json!({"topic": topic, "partition": 0, "offset": 0, "reason": "poison"}),
        )
        .await;
    assert_eq!(got, 200, "{done}");
    assert_eq!(done["outcome"], "dead_lettered");
    assert_eq!(
        done["replica"],
        owner_of(0).as_str(),
        "carried out by the owner"
    );
    // Partition 1's key is retried through the replica that does not own it.
    d.faults(|f| f.fail_keys.clear());
    let (via1, _) = if owner_of(1) == "r1" {
        (&a2, &a1)
    } else {
        (&a1, &a2)
    };
    let (got, done) = via1
        .post(
            &action("main", "retry"),
            &json!({"topic": topic, "partition": 1, "offset": 0}),
        )
        .await;
    assert_eq!((got, &done["outcome"]), (200, &json!("retrying")), "{done}");
    assert_eq!(done["replica"], owner_of(1).as_str());
    wait_for(
        "the retried record accepted",
        Duration::from_secs(10),
        || (accepted_of(&d, "wf-main") == [1]).then_some(()),
    )
    .await;
    // A pause sent to one replica holds on both; a resume sent to the other lifts it.
    let (got, done) = other
        .post(&action("side", "pause"), &json!({"reason": "maintenance"}))
        .await;
    assert_eq!(got, 200, "{done}");
    assert_eq!(done["replicas"].as_array().unwrap().len(), 1, "{done}");
    assert_eq!(done["replicas"][0]["status"], 200, "{done}");
    for api in [&a1, &a2] {
        let (_, local) = api.get("/api/v1/status?scope=local&trigger=side").await;
        assert_eq!(
            local["connections"][0]["triggers"][0]["state"], "paused",
            "{local}"
        );
    }
    let owner = wait_for_async(
        "the side partition's owner",
        Duration::from_secs(30),
        || async {
            let t = a1.trigger("it", "side").await?;
            let p = t["partitions"].as_array()?.first()?.clone();
            (p["paused_reason"] == "paused by an operator").then_some(p["owner"].clone())
        },
    )
    .await;
    assert!(owner == "r1" || owner == "r2");
    let (got, done) = via.post(&action("side", "resume"), &json!({})).await;
    assert_eq!(got, 200, "{done}");
    for api in [&a1, &a2] {
        let (_, local) = api.get("/api/v1/status?scope=local&trigger=side").await;
        assert_eq!(
            local["connections"][0]["triggers"][0]["state"], "running",
            "{local}"
        );
    }
    produce_to(&side, 0, &[("s", 7)]).await;
    wait_for(
        "the side trigger runs again",
        Duration::from_secs(30),
        || (accepted_of(&d, "wf-side") == [7]).then_some(()),
    )
    .await;
}

/// Where CI artifacts go: `$TESSEL_KAFKA_CACHE/artifacts` (default
/// `~/.cache/tessel-kafka/artifacts`); `scripts/test` lists them at the end.
fn artifacts_dir() -> std::path::PathBuf {
    let cache = std::env::var_os("TESSEL_KAFKA_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/tessel-kafka")
        });
    let dir = cache.join("artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    dir
}

/// The console in a real browser (Debian's headless Chromium through Selenium with Debian's
/// chromedriver, scripts/py/console_check.py): a read token sees the parked key with its
/// buttons disabled; an act token loads the region view (screenshot kept as an artifact),
/// opens the trigger, presses skip, confirms with a reason and sees the key gone; the record
/// is in the dead-letter topic and the commit passes it.
#[tokio::test]
async fn the_console_in_a_real_browser_shows_the_parked_key_and_skips_it() {
    let (topic, dlq, side) = (
        unique("ctl-ui"),
        unique("ctl-ui-dlq"),
        unique("ctl-ui-side"),
    );
    let group = unique("ctl-ui-group");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let named = crate::support::key_topic(&stack().bootstrap, &topic);
    let failing = format!("kafka:{group}:{named}:0:0");
    d.faults(|f| {
        f.fail_status = 500;
        f.fail_keys.insert(failing.clone());
    });
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{}{}",
        two_triggers(&group, &topic, &dlq, &side, &d.url()),
        control_sections(state.path(), "tk-0", &[])
    ));
    let _daemon = Killed(Some(spawn_daemon(&config, Stdio::inherit())));
    let api = Api::new(&format!("http://127.0.0.1:{port}"), ACT);
    produce_to(
        &topic,
        0,
        &[("order-42", 0), ("order-43", 1), ("order-42", 2)],
    )
    .await;
    produce_to(&side, 0, &(0..5).map(|i| ("s", i)).collect::<Vec<_>>()).await;
    let _ = parked_at(&api, "main", 0, Duration::from_secs(60)).await;
    // The region view shows a paused trigger too, its records waiting.
    wait_for("the side trigger's runs", Duration::from_secs(30), || {
        (accepted_of(&d, "wf-side").len() == 5).then_some(())
    })
    .await;
    let (got, _) = api
        .post(
            &action("side", "pause"),
            &json!({"reason": "deploying wf-side v2"}),
        )
        .await;
    assert_eq!(got, 200);
    produce_to(&side, 0, &(5..9).map(|i| ("s", i)).collect::<Vec<_>>()).await;
    let screenshot = artifacts_dir().join(format!(
        "console-region-kafka-{}.png",
        stack().kafka_version
    ));
    let spec = json!({
        "url": api.base, "token": ACT, "read_token": READ, "trigger": "it/main", "offset": 0,
        "reason": "poison record, order-42 fixed by hand", "screenshot": screenshot,
    });
    let started = Instant::now();
    let out = super::run_reference("console_check.py", spec).await;
    eprintln!(
        "console checked in a browser in {} ms; region view screenshot: {}",
        started.elapsed().as_millis(),
        screenshot.display()
    );
    assert_eq!(out["read_only_disabled"], true, "{out}");
    assert_eq!(out["parked_seen"], true, "{out}");
    assert!(
        out["parked_row"].as_str().unwrap().contains("HTTP 500"),
        "{out}"
    );
    assert!(
        out["message"].as_str().unwrap().contains("dead_lettered"),
        "{out}"
    );
    assert_eq!(out["gone"], true, "{out}");
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let letters = read_topic(&dlq, 1).await;
    assert_eq!(letters[0].headers["tessel.skipped.by"], "oncall");
    wait_for(
        "order-42 at 2 runs after the skip",
        Duration::from_secs(30),
        || (accepted_of(&d, "wf-main") == [1, 2]).then_some(()),
    )
    .await;
    wait_for(
        "the commit past the skipped record",
        Duration::from_secs(30),
        || (committed(&group, &topic, 1) == [3]).then_some(()),
    )
    .await;
}

/// `tessel-kafka ctl …` against the daemon, with the act token; its stdout, or a panic with
/// its stderr.
async fn ctl(base: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(crate::support::binary())
        .arg("ctl")
        .args(args)
        .env("TESSEL_KAFKA_URL", base)
        .env("TESSEL_KAFKA_API_TOKEN", ACT)
        .output()
        .await
        .expect("run ctl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ctl {args:?} failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// CLI parity: `ctl status` names the parked keys, `ctl skip` dead-letters one, `ctl retry`
/// runs one at once, `ctl pause` and `ctl resume` hold and release a trigger, and `ctl
/// redrive` dispatches the dead letter again and follows it to its end.
#[tokio::test]
async fn ctl_shows_the_region_and_acts_as_the_console_does() {
    let (topic, dlq, side) = (
        unique("ctl-cli"),
        unique("ctl-cli-dlq"),
        unique("ctl-cli-side"),
    );
    let group = unique("ctl-cli-group");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let named = crate::support::key_topic(&stack().bootstrap, &topic);
    let id = |offset: i64| format!("kafka:{group}:{named}:0:{offset}");
    d.faults(|f| {
        f.fail_status = 503;
        f.fail_keys.insert(id(0));
        f.fail_keys.insert(id(1));
    });
    let state = tempfile::tempdir().unwrap();
    // The API on a listener of its own: /metrics and the probes stay on server.listen.
    let (port, api_port) = (free_port(), free_port());
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{}[api]\nlisten = \"127.0.0.1:{api_port}\"\n{}",
        two_triggers(&group, &topic, &dlq, &side, &d.url()),
        control_sections(state.path(), "tk-0", &[])
    ));
    let _daemon = Killed(Some(spawn_daemon(&config, Stdio::inherit())));
    let base = format!("http://127.0.0.1:{api_port}");
    let api = Api::new(&base, ACT);
    produce_to(&topic, 0, &[("a", 0), ("b", 1)]).await;
    let admin = Api::new(&format!("http://127.0.0.1:{port}"), ACT);
    assert!(admin.metrics().await.contains("tessel_kafka_build_info"));
    assert_eq!(admin.get("/livez").await.0, 200);
    assert_eq!(
        admin.get("/api/v1/status").await.0,
        404,
        "not on server.listen"
    );
    assert_eq!(
        api.get("/metrics").await.0,
        404,
        "only the API and console on api.listen"
    );
    let _ = parked_at(&api, "main", 0, Duration::from_secs(60)).await;
    let _ = parked_at(&api, "main", 1, Duration::from_secs(10)).await;

    let text = ctl(&base, &["status", "--parked"]).await;
    assert!(text.contains("trigger main → wf-main: running"), "{text}");
    assert!(
        text.contains(&format!("parked {topic}[0] offset 0 key \"a\"")),
        "{text}"
    );
    assert!(text.contains("last: HTTP 503: injected failure"), "{text}");
    let record = |o: &str| {
        [
            "--trigger",
            "main",
            "--topic",
            &topic,
            "--partition",
            "0",
            "--offset",
            o,
        ]
        .map(str::to_owned)
    };
    let mut skip: Vec<String> = vec!["skip".into()];
    skip.extend(record("0"));
    skip.extend(["--reason".into(), "bad payload".into()]);
    let text = ctl(&base, &skip.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(text.contains("offset 0: dead_lettered to"), "{text}");
    d.faults(|f| f.fail_keys.clear());
    let mut retry: Vec<String> = vec!["retry".into()];
    retry.extend(record("1"));
    let text = ctl(&base, &retry.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(text.contains("offset 1: retrying (on tk-0)"), "{text}");
    wait_for("offset 1 accepted", Duration::from_secs(10), || {
        (accepted_of(&d, "wf-main") == [1]).then_some(())
    })
    .await;

    let text = ctl(
        &base,
        &["pause", "--trigger", "side", "--reason", "deploying"],
    )
    .await;
    assert_eq!(text, "trigger side: paused\n");
    let json: Value =
        serde_json::from_str(&ctl(&base, &["status", "--json", "--trigger", "side"]).await)
            .unwrap();
    assert_eq!(
        json["connections"][0]["triggers"][0]["state"], "paused",
        "{json}"
    );
    let text = ctl(&base, &["resume", "--trigger", "side"]).await;
    assert_eq!(text, "trigger side: resumed\n");

    // The skipped record, redriven: dispatched again under its own key, accepted.
    let text = ctl(&base, &["redrive", "--trigger", "main"]).await;
    assert!(
        text.contains("done: 1 read, 1 accepted, 0 failed"),
        "{text}"
    );
    let keys: Vec<String> = d.runs().iter().map(|r| r.idempotency_key.clone()).collect();
    assert!(keys.contains(&id(0)), "{keys:?}");
    let (_, list) = api.get("/api/v1/redrives").await;
    assert_eq!(list["redrives"][0]["state"], "done", "{list}");
    assert_eq!(list["redrives"][0]["by"], "oncall", "{list}");
}

/// With `[region.kafka]` the target states live in the region's compacted control topic:
/// a pause written through one replica reaches the other through the topic (not forwarded),
/// a replica that restarts reads it back before its connections start, and each replica finds
/// the other in the topic's directory (the region status has both).
#[tokio::test]
async fn with_a_region_cluster_target_states_live_in_the_control_topic() {
    let (topic, dlq, side) = (unique("ctl-k"), unique("ctl-k-dlq"), unique("ctl-k-side"));
    let group = unique("ctl-k-group");
    let control = unique("ctl-k-control");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let (p1, p2) = (free_port(), free_port());
    let toml = two_triggers(&group, &topic, &dlq, &side, &d.url());
    let config = |port: u16, replica: &str| {
        let state = std::env::temp_dir().join(unique("ctl-k-state"));
        let sections = control_sections(&state, replica, &[]);
        temp_config(&format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}{sections}advertise_url = \"http://127.0.0.1:{port}\"\n[region.kafka]\n\"bootstrap.servers\" = \"{}\"\n[region.control]\ntopic = \"{control}\"\n",
            stack().bootstrap
        ))
    };
    let (c1, c2) = (config(p1, "k1"), config(p2, "k2"));
    let _r1 = Killed(Some(spawn_daemon(&c1, Stdio::inherit())));
    let mut r2 = Killed(Some(spawn_daemon(&c2, Stdio::inherit())));
    let (a1, a2) = (
        Api::new(&format!("http://127.0.0.1:{p1}"), ACT),
        Api::new(&format!("http://127.0.0.1:{p2}"), ACT),
    );
    let local_state = |api: &Api| {
        let api = Api::new(&api.base, ACT);
        async move {
            let (status, body) = api.get("/api/v1/status?scope=local&trigger=side").await;
            (status == 200).then(|| body["connections"][0]["triggers"][0]["state"].clone())
        }
    };
    wait_for_async("both replicas answer", Duration::from_secs(60), || async {
        Some((local_state(&a1).await?, local_state(&a2).await?))
    })
    .await;

    let (got, done) = a1
        .post(
            &action("side", "pause"),
            &json!({"reason": "region maintenance"}),
        )
        .await;
    assert_eq!(got, 200, "{done}");
    assert!(
        done.get("replicas").is_none(),
        "not forwarded: the topic carries it: {done}"
    );
    wait_for_async(
        "the other replica paused through the topic",
        Duration::from_secs(10),
        || async { (local_state(&a2).await? == "paused").then_some(()) },
    )
    .await;
    let records = read_topic(&control, 1).await;
    assert!(!records.is_empty());

    terminate(r2.take()).await;
    let _r2 = Killed(Some(spawn_daemon(&c2, Stdio::inherit())));
    let state = wait_for_async(
        "the restarted replica answers",
        Duration::from_secs(60),
        || local_state(&a2),
    )
    .await;
    assert_eq!(state, "paused", "read back from the control topic");
    let (got, done) = a2.post(&action("side", "resume"), &json!({})).await;
    assert_eq!(got, 200, "{done}");
    wait_for_async(
        "the first replica resumed through the topic",
        Duration::from_secs(10),
        || async { (local_state(&a1).await? == "running").then_some(()) },
    )
    .await;
    // The directory: each replica's region status has the other.
    let replicas = wait_for_async(
        "both replicas in the region status",
        Duration::from_secs(40),
        || async {
            let (_, body) = a1.get("/api/v1/status").await;
            let ids: Vec<String> = body["replicas"]
                .as_array()?
                .iter()
                .filter(|r| r["reachable"] == true)
                .filter_map(|r| r["id"].as_str().map(str::to_owned))
                .collect();
            (ids.len() == 2).then_some(ids)
        },
    )
    .await;
    assert_eq!(replicas, ["k1", "k2"]);
}

/// Without a region cluster, a replica that was down when a trigger was paused (or that is
/// new) takes the pause from its peers when it starts, before its connections run: the pause
/// holds on every replica.
#[tokio::test]
async fn a_replica_that_was_down_takes_the_pause_from_its_peers_when_it_starts() {
    let (topic, dlq, side) = (unique("ctl-s"), unique("ctl-s-dlq"), unique("ctl-s-side"));
    let group = unique("ctl-s-group");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    create_topic(&side, 1).await;
    let d = dispatcher(Faults::default()).await;
    let (p1, p2) = (free_port(), free_port());
    let (s1, s2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let toml = two_triggers(&group, &topic, &dlq, &side, &d.url());
    let config = |port: u16, state: &std::path::Path, replica: &str, peer: u16| {
        temp_config(&format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}{}",
            control_sections(state, replica, &[url(peer)])
        ))
    };
    let _r1 = Killed(Some(spawn_daemon(
        &config(p1, s1.path(), "r1", p2),
        Stdio::inherit(),
    )));
    let (a1, a2) = (Api::new(&url(p1), ACT), Api::new(&url(p2), ACT));
    wait_for_async("r1 answers", Duration::from_secs(60), || async {
        (a1.get("/api/v1/status?scope=local").await.0 == 200).then_some(())
    })
    .await;
    let (got, done) = a1
        .post(
            &action("side", "pause"),
            &json!({"reason": "while r2 is away"}),
        )
        .await;
    assert_eq!(got, 200, "{done}");
    assert!(
        done["replicas"][0]["error"].is_string(),
        "r2 is down: {done}"
    );
    let _r2 = Killed(Some(spawn_daemon(
        &config(p2, s2.path(), "r2", p1),
        Stdio::inherit(),
    )));
    let state = wait_for_async("r2 answers", Duration::from_secs(60), || async {
        let (status, body) = a2.get("/api/v1/status?scope=local&trigger=side").await;
        (status == 200).then(|| body["connections"][0]["triggers"][0].clone())
    })
    .await;
    assert_eq!(state["state"], "paused", "{state}");
    assert_eq!(state["target"]["reason"], "while r2 is away");
    assert!(
        s2.path().join("target-states.json").exists(),
        "stored on r2 too"
    );
    produce_to(&side, 0, &[("s", 1)]).await;
    produce_to(&topic, 0, &[("m", 2)]).await;
    wait_for("the running trigger's run", Duration::from_secs(60), || {
        (accepted_of(&d, "wf-main") == [2]).then_some(())
    })
    .await;
    assert!(
        accepted_of(&d, "wf-side").is_empty(),
        "paused on whichever replica owns it"
    );
}
