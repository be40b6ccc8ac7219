//! Operators' view of and hands on a live region (issue 35): one status model of the region
//! (connections → triggers → partitions, with the parked keys), actions on it (pause and
//! resume a trigger, retry or skip a parked record, redrive dead letters), served as an API
//! (`/api/v1/…`), a web console (`/console`) and `tessel-kafka ctl`.
//!
//! Two floors live here. Shared state that runs and shells write, beside [`crate::run`]:
//! [`trigger`] (a trigger's target state, parked keys, recent outcomes) and [`recent`] (its
//! windows). And the service, beside [`crate::admin`]: [`gate`] (how the shell applies a
//! paused trigger to its partitions, pure), [`hub`] (the replica's registry of connections and
//! the actions), [`status`] (the model and how replicas' reports merge, pure), [`store`]
//! (where target states live: a file, or the region cluster's compacted control topic),
//! [`auth`] (bearer tokens, read and act grants), [`peers`] (forwarding to the other
//! replicas), [`api`] (the HTTP handlers), [`redrive`] and the console's page.
//! Design and reasons: docs/architecture.md, "Operator controls".

pub mod api;
pub mod auth;
pub mod gate;
pub mod hub;
pub mod peers;
pub mod recent;
pub mod redrive;
pub mod status;
pub mod store;
pub mod trigger;

pub use hub::{ConnectionControl, ControlHub};
pub use trigger::{
    ActionError, ActionOutcome, DeadLetterPosition, Directive, ParkedKey, ParkedRun, RunState,
    TargetState, TriggerControl,
};

use crate::config::{ErrorPolicy, TriggerConfig};

/// What happens next to a parked record, per the trigger's `retry` and `on_error`, after
/// `attempts` failed attempts: shown with the parked key.
pub fn what_next(config: &TriggerConfig, attempts: u32) -> String {
    let max = config.retry.max_attempts;
    let policy = match config.on_error {
        ErrorPolicy::Block => {
            "on_error = \"block\" holds it (tried again until accepted)".to_owned()
        }
        ErrorPolicy::Skip => "on_error = \"skip\" skips it".to_owned(),
        ErrorPolicy::DeadLetter => format!(
            "on_error = \"dead_letter\" writes it to {}",
            config
                .dead_letter_topic
                .as_deref()
                .unwrap_or("the dead-letter topic")
        ),
    };
    let retries = if max == 0 {
        "tried again with backoff until the dispatcher accepts it (retry.max_attempts = 0); a refusal (4xx) goes to ".to_owned()
            + &policy
    } else if attempts < max {
        format!("tried again with backoff, {attempts} of retry.max_attempts = {max} made; then {policy}")
    } else {
        match config.on_error {
            ErrorPolicy::Block => format!("retry.max_attempts = {max} reached: {policy}"),
            _ => {
                format!("retry.max_attempts = {max} reached and {policy}: that failed, tried again")
            }
        }
    };
    let skip = match &config.dead_letter_topic {
        Some(t) => format!("skip writes it to {t}"),
        None => "skip records it as skipped (no dead_letter_topic)".to_owned(),
    };
    format!("{retries}; {skip} and lets its key go on")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(extra: &str) -> TriggerConfig {
        let text = format!(
            "topics = [\"t\"]\nworkflow = \"w\"\ndispatcher = {{ url = \"http://127.0.0.1:1/runs\" }}\n{extra}"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn what_next_follows_retry_and_on_error() {
        let block = trigger("");
        assert_eq!(
            what_next(&block, 3),
            "tried again with backoff until the dispatcher accepts it (retry.max_attempts = 0); a refusal (4xx) goes to on_error = \"block\" holds it (tried again until accepted); skip records it as skipped (no dead_letter_topic) and lets its key go on"
        );
        let dlq = trigger(
            "on_error = \"dead_letter\"\ndead_letter_topic = \"d\"\nretry = { max_attempts = 5 }",
        );
        assert_eq!(
            what_next(&dlq, 2),
            "tried again with backoff, 2 of retry.max_attempts = 5 made; then on_error = \"dead_letter\" writes it to d; skip writes it to d and lets its key go on"
        );
        let held = trigger("dead_letter_topic = \"d\"\nretry = { max_attempts = 5 }");
        assert!(
            what_next(&held, 5).starts_with("retry.max_attempts = 5 reached: on_error = \"block\"")
        );
    }
}
