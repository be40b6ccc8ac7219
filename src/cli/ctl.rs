//! `tessel-kafka ctl`: the operator API from the command line, against a running daemon
//! (any replica of the region: actions reach the owner). What the console does, as commands:
//! `status`, `pause`, `resume`, `retry`, `skip`, `redrive`.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::control::status::RegionStatus;

/// `tessel-kafka ctl …`.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The daemon's admin (or `api.listen`) URL.
    #[arg(
        long,
        env = "TESSEL_KAFKA_URL",
        default_value = "http://127.0.0.1:9464"
    )]
    pub url: String,
    /// An `[api.tokens]` bearer token (an act token for the actions).
    #[arg(long, env = "TESSEL_KAFKA_API_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Print the API's JSON answer instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// The trigger an action is on.
#[derive(Debug, Clone, clap::Args)]
pub struct TriggerArgs {
    /// The connection (default: the only one the token sees).
    #[arg(long)]
    pub connection: Option<String>,
    /// The trigger.
    #[arg(long)]
    pub trigger: String,
}

/// A parked record.
#[derive(Debug, Clone, clap::Args)]
pub struct RecordArgs {
    /// Its topic.
    #[arg(long)]
    pub topic: String,
    /// Its partition.
    #[arg(long)]
    pub partition: i32,
    /// Its offset.
    #[arg(long)]
    pub offset: i64,
}

/// `ctl` commands.
#[derive(Debug, clap::Subcommand)]
pub enum CtlCommand {
    /// The region: connections, triggers, partitions and every parked key.
    Status {
        /// Only this connection.
        #[arg(long)]
        connection: Option<String>,
        /// Only this trigger.
        #[arg(long)]
        trigger: Option<String>,
        /// Only triggers with parked keys.
        #[arg(long)]
        parked: bool,
        /// Also each partition.
        #[arg(long)]
        partitions: bool,
    },
    /// Pause a trigger: no new run starts; its partitions stay assigned; runs in flight
    /// finish. Holds across restarts, rebalances and replicas.
    Pause {
        #[command(flatten)]
        target: TriggerArgs,
        /// Why (shown in the status and the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused trigger.
    Resume {
        #[command(flatten)]
        target: TriggerArgs,
    },
    /// Try a parked record now instead of at its next backoff.
    Retry {
        #[command(flatten)]
        target: TriggerArgs,
        #[command(flatten)]
        record: RecordArgs,
    },
    /// Skip a parked record: to the trigger's dead-letter topic (or recorded as skipped
    /// without one), then its key goes on.
    Skip {
        #[command(flatten)]
        target: TriggerArgs,
        #[command(flatten)]
        record: RecordArgs,
        /// Why (required; goes into the dead letter and the audit log).
        #[arg(long)]
        reason: String,
    },
    /// Dispatch a range of the trigger's dead letters again (what `dlq replay` does), run by
    /// the daemon; prints its progress.
    Redrive {
        #[command(flatten)]
        target: TriggerArgs,
        /// Only this partition of the dead-letter topic (repeatable; default: every one).
        #[arg(long = "partition")]
        partitions: Vec<i32>,
        /// First offset in each partition.
        #[arg(long, default_value_t = 0)]
        from: i64,
        /// Stop before this offset in each partition (default: the end).
        #[arg(long)]
        to: Option<i64>,
        /// Say what would be sent, send nothing.
        #[arg(long)]
        dry_run: bool,
        /// Return once started instead of following it to its end.
        #[arg(long)]
        no_wait: bool,
    },
}

/// Runs `ctl`.
pub async fn run(args: CtlArgs) -> ExitCode {
    match execute(&args).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Client {
    async fn send(&self, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let req = match body {
            Some(b) => self.http.post(&url).json(b),
            None => self.http.get(&url),
        };
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !(200..300).contains(&status) {
            let why = body["error"].as_str().unwrap_or("no reason given");
            bail!("HTTP {status}: {why}");
        }
        Ok(body)
    }
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

async fn execute(args: &CtlArgs) -> anyhow::Result<String> {
    let client = Client {
        base: args.url.clone(),
        token: args.token.clone(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?,
    };
    let out = match &args.command {
        CtlCommand::Status {
            connection,
            trigger,
            parked,
            partitions,
        } => {
            let mut path = "/api/v1/status?scope=region".to_owned();
            if let Some(c) = connection {
                let _ = write!(path, "&connection={}", enc(c));
            }
            if let Some(t) = trigger {
                let _ = write!(path, "&trigger={}", enc(t));
            }
            if *parked {
                path.push_str("&parked=true");
            }
            let body = client.send(&path, None).await?;
            if args.json {
                return Ok(pretty(&body));
            }
            let status: RegionStatus = serde_json::from_value(body)?;
            return Ok(render_status(&status, *partitions));
        }
        CtlCommand::Pause { target, reason } => {
            let body = json!({ "reason": reason });
            act(&client, target, "pause", &body).await?
        }
        CtlCommand::Resume { target } => act(&client, target, "resume", &json!({})).await?,
        CtlCommand::Retry { target, record } => {
            let body = json!({"topic": record.topic, "partition": record.partition, "offset": record.offset});
            act(&client, target, "retry", &body).await?
        }
        CtlCommand::Skip {
            target,
            record,
            reason,
        } => {
            let body = json!({"topic": record.topic, "partition": record.partition, "offset": record.offset, "reason": reason});
            act(&client, target, "skip", &body).await?
        }
        CtlCommand::Redrive {
            target,
            partitions,
            from,
            to,
            dry_run,
            no_wait,
        } => {
            let body =
                json!({"partitions": partitions, "from": from, "to": to, "dry_run": dry_run});
            let started = act(&client, target, "redrive", &body).await?;
            let id = started["id"].as_str().unwrap_or_default().to_owned();
            let mut last = started;
            if !*no_wait {
                loop {
                    if last["state"] != "running" {
                        break;
                    }
                    if !args.json {
                        eprintln!("{}", progress_line(&last));
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    last = client
                        .send(&format!("/api/v1/redrives/{}", enc(&id)), None)
                        .await?;
                }
                if last["state"] == "failed" {
                    bail!(
                        "redrive {id} failed: {}",
                        last["error"].as_str().unwrap_or("no reason")
                    );
                }
            }
            last
        }
    };
    if args.json {
        return Ok(pretty(&out));
    }
    Ok(action_line(&args.command, &out))
}

async fn act(
    client: &Client,
    target: &TriggerArgs,
    action: &str,
    body: &Value,
) -> anyhow::Result<Value> {
    let connection = match &target.connection {
        Some(c) => c.clone(),
        None => only_connection(client).await?,
    };
    let path = format!(
        "/api/v1/connections/{}/triggers/{}/{action}",
        enc(&connection),
        enc(&target.trigger)
    );
    client.send(&path, Some(body)).await
}

/// The one connection the token sees, for actions that name none.
async fn only_connection(client: &Client) -> anyhow::Result<String> {
    let body = client.send("/api/v1/status?scope=local", None).await?;
    let names: Vec<String> = body["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("the token sees no connection"),
        _ => bail!(
            "several connections ({}); name one with --connection",
            names.join(", ")
        ),
    }
}

fn pretty(v: &Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default())
}

fn progress_line(p: &Value) -> String {
    format!(
        "redrive {} {}: {} read, {} accepted, {} failed",
        p["id"].as_str().unwrap_or("?"),
        p["state"].as_str().unwrap_or("?"),
        p["records"],
        p["accepted"],
        p["failed"]
    )
}

/// One line saying what an action did.
fn action_line(command: &CtlCommand, out: &Value) -> String {
    let already = if out["already"] == true {
        " (already)"
    } else {
        ""
    };
    let outcome = out["outcome"].as_str().unwrap_or("ok");
    match command {
        CtlCommand::Redrive { .. } => format!("{}\n", progress_line(out)),
        CtlCommand::Retry { record, .. } | CtlCommand::Skip { record, .. } => {
            let mut line = format!(
                "{}[{}] offset {}: {outcome}{already}",
                record.topic, record.partition, record.offset
            );
            if let Some(d) = out.get("dead_letter").filter(|d| !d.is_null()) {
                let _ = write!(
                    line,
                    " to {}[{}] offset {}",
                    d["topic"].as_str().unwrap_or("?"),
                    d["partition"],
                    d["offset"]
                );
            }
            if let Some(r) = out["replica"].as_str() {
                let _ = write!(line, " (on {r})");
            }
            line + "\n"
        }
        CtlCommand::Pause { target, .. } | CtlCommand::Resume { target } => {
            let mut line = format!("trigger {}: {outcome}{already}", target.trigger);
            for r in out["replicas"].as_array().into_iter().flatten() {
                let who = r["replica"].as_str().or(r["url"].as_str()).unwrap_or("?");
                match r["outcome"].as_str() {
                    Some(o) => {
                        let _ = write!(line, "; {who}: {o}");
                    }
                    None => {
                        let _ = write!(
                            line,
                            "; {who}: {}",
                            r["error"].as_str().unwrap_or("no answer")
                        );
                    }
                }
            }
            line + "\n"
        }
        CtlCommand::Status { .. } => String::new(),
    }
}

/// The status as text: a block per connection, a line per trigger, a line per parked key.
pub fn render_status(s: &RegionStatus, partitions: bool) -> String {
    let mut out = String::new();
    let replicas: Vec<String> = s
        .replicas
        .iter()
        .map(|r| match &r.error {
            None => r.id.clone(),
            Some(e) => format!("{} (unreachable: {e})", r.id),
        })
        .collect();
    let _ = writeln!(out, "region {}: replicas {}", s.region, replicas.join(", "));
    for c in &s.connections {
        let reach = match (c.brokers_up, c.registry_reachable) {
            (Some(b), Some(r)) => format!(
                "brokers {}, registry {}",
                if b { "up" } else { "DOWN" },
                if r { "ok" } else { "DOWN" }
            ),
            _ => "not running".to_owned(),
        };
        let _ = writeln!(
            out,
            "connection {} (on {}; {reach})",
            c.name,
            c.running_on.join(", ")
        );
        if let Some(e) = &c.last_error {
            let _ = writeln!(out, "  error: {e}");
        }
        for t in &c.triggers {
            let state = match (&t.stopped, t.target.state) {
                (Some(why), _) => format!("STOPPED ({why})"),
                (None, crate::control::RunState::Paused) => format!(
                    "PAUSED by {}{}",
                    t.target.by.as_deref().unwrap_or("?"),
                    t.target
                        .reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ),
                (None, crate::control::RunState::Running) => "running".to_owned(),
            };
            let recent = |k: &str| t.last_5m.get(k).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "  trigger {} → {}: {state}; lag {} records, oldest {:.1} s; in flight {}, parked {}; last 5 min {} accepted, {} filtered, {} expired, {} dead-lettered",
                t.name,
                t.workflow,
                t.lag_records,
                t.lag_seconds,
                t.runs_in_flight,
                t.parked.len(),
                recent("accepted"),
                recent("filtered"),
                recent("expired"),
                recent("dead_lettered") + recent("expired_dead_lettered"),
            );
            for k in &t.parked {
                let key = k
                    .key
                    .as_deref()
                    .map(|k| format!("{k:?}"))
                    .or_else(|| k.key_base64.as_ref().map(|b| format!("base64:{b}")))
                    .unwrap_or_else(|| "(no key)".to_owned());
                let answer = match (k.last_status, &k.last_answer) {
                    (Some(s), Some(a)) => format!("HTTP {s}: {a}"),
                    (None, Some(a)) => a.clone(),
                    (Some(s), None) => format!("HTTP {s}"),
                    (None, None) => String::new(),
                };
                let _ = writeln!(
                    out,
                    "    parked {}[{}] offset {} key {key}: {} attempts, since {}, next {} on {}; last: {answer}",
                    k.topic,
                    k.partition,
                    k.offset,
                    k.attempts,
                    clock(k.since_ms),
                    clock(k.next_attempt_ms),
                    k.owner
                );
            }
            if partitions {
                for p in &t.partitions {
                    let _ = writeln!(
                        out,
                        "    partition {}[{}] on {}: commit {}, {} waiting, {} in flight, lag {}{}{}",
                        p.topic,
                        p.partition,
                        p.owner,
                        p.commit_offset.map_or("-".to_owned(), |o| o.to_string()),
                        p.waiting,
                        p.in_flight,
                        p.lag_records.map_or("-".to_owned(), |l| l.to_string()),
                        p.paused_reason.as_deref().map(|r| format!(", paused ({r})")).unwrap_or_default(),
                        p.stalled.as_deref().map(|r| format!(", STALLED: {r}")).unwrap_or_default(),
                    );
                }
            }
        }
    }
    out
}

/// A time of day (UTC) from milliseconds since the epoch.
fn clock(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.format("%H:%M:%SZ").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::status::{ConnectionStatus, ReplicaStatus, TriggerStatus};
    use crate::control::ParkedKey;

    #[test]
    fn the_status_reads_as_one_line_per_trigger_and_parked_key() {
        let s = RegionStatus {
            region: "eu".into(),
            replicas: vec![ReplicaStatus {
                id: "tk-0".into(),
                reachable: true,
                ..ReplicaStatus::default()
            }],
            connections: vec![ConnectionStatus {
                name: "orders".into(),
                running_on: vec!["tk-0".into()],
                brokers_up: Some(true),
                registry_reachable: Some(true),
                triggers: vec![TriggerStatus {
                    name: "fraud".into(),
                    workflow: "fraud-check".into(),
                    lag_records: 3,
                    parked: vec![ParkedKey {
                        topic: "payments".into(),
                        partition: 2,
                        offset: 41,
                        offsets: vec![41],
                        key: Some("c-7".into()),
                        key_base64: None,
                        attempts: 12,
                        since_ms: 0,
                        next_attempt_ms: 30_000,
                        last_status: Some(500),
                        last_answer: Some("boom".into()),
                        next: String::new(),
                        owner: "tk-0".into(),
                    }],
                    ..TriggerStatus::default()
                }],
                ..ConnectionStatus::default()
            }],
            ..RegionStatus::default()
        };
        let text = render_status(&s, false);
        assert!(
            text.contains("connection orders (on tk-0; brokers up, registry ok)"),
            "{text}"
        );
        assert!(
            text.contains("trigger fraud → fraud-check: running; lag 3 records"),
            "{text}"
        );
        assert!(
            text.contains("parked payments[2] offset 41 key \"c-7\": 12 attempts, since 00:00:00Z, next 00:00:30Z on tk-0; last: HTTP 500: boom"),
            "{text}"
        );
    }
}
