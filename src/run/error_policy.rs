//! What a run does with a record that failed: the step after a panic or a decode error, the
//! age check, and `on_error` (skip, or the dead-letter copy with its headers).

use rdkafka::message::{Message, OwnedMessage};
use tokio::time::Instant;

use super::decide::{decide, Attempts, Failure, Next, Observed, Step};
use super::{TriggerRuntime, WorkOutcome};
use crate::codec::{DecodeError, Field};
use crate::config::{ErrorPolicy, ExpiredPolicy};
use crate::core::record_age;
use crate::produce::producer::ExtraHeader;
use crate::telemetry::metrics;

/// The text a panic carried (`panic!` with a literal or with formatting).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// A panic inside one attempt of the run whose (first) record is `msg`: counted and logged;
/// the attempt failed like a transient dispatch failure (`transient` counts them, this one
/// included), so `retry.max_attempts` and then `on_error` decide.
pub(super) fn on_panic(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    panic: &(dyn std::any::Any + Send),
    transient: u32,
) -> Step {
    let what = panic_message(panic);
    metrics::worker_panic(&trigger.connection, &trigger.name);
    trigger.failed(&format!("worker panicked on a record: {what}"));
    tracing::error!(
        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
        partition = msg.partition(), offset = msg.offset(), attempt = transient,
        error = %sanitize(&what), "worker panicked while handling the record; it is retried per the trigger's retry policy, then on_error applies"
    );
    Step::of(
        decide(Observed::Panicked, transient, &trigger.retry_policy()),
        |class| Failure {
            stage: "DISPATCH",
            class,
            message: format!("worker panicked: {what}"),
            status: None,
            schema_id: None,
        },
    )
}

pub(super) fn on_decode_error(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    field: Field,
    e: &DecodeError,
    attempts: &mut Attempts,
) -> Step {
    metrics::decode_error(&trigger.connection, &trigger.name, e.class());
    trigger.failed(&format!(
        "cannot decode {}[{}] offset {}: {}",
        msg.topic(),
        msg.partition(),
        msg.offset(),
        e.class()
    ));
    if matches!(e, DecodeError::Registry(_)) {
        metrics::registry_error(&trigger.connection, e.class());
    }
    tracing::warn!(
        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
        partition = msg.partition(), offset = msg.offset(), field = ?field,
        class = e.class(), error = %e, "cannot decode message"
    );
    let failure = || Failure {
        stage: if field == Field::Key {
            "KEY_DESERIALIZE"
        } else {
            "VALUE_DESERIALIZE"
        },
        class: e.class(),
        message: e.to_string(),
        status: None,
        schema_id: e.schema_id(),
    };
    let observed = Observed::undecodable(e, &mut attempts.first_schema_not_found);
    let next = decide(observed, attempts.transient, &trigger.retry_policy());
    if next == Next::Stop {
        trigger.stop(&e.to_string());
    }
    // The failure keeps the decoder's own class.
    Step::of(next, |_| failure())
}

/// Applies `on_error`; None means "not handled, retry later".
pub(super) async fn apply_error_policy(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    topic_id: Option<&str>,
    id: &str,
    attempts: &Attempts,
    failure: &Failure,
) -> Option<WorkOutcome> {
    // An expired record reaches here only with on_expired = "dead_letter".
    let expired = failure.stage == record_age::STAGE;
    let policy = if expired {
        ErrorPolicy::DeadLetter
    } else {
        trigger.config.on_error
    };
    match policy {
        ErrorPolicy::Block => None,
        ErrorPolicy::Skip => {
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), class = failure.class,
                error = %failure.message, "message skipped by on_error = skip"
            );
            Some(WorkOutcome::Skipped)
        }
        ErrorPolicy::DeadLetter => {
            let (Some(producer), Some(topic)) =
                (&trigger.producer, &trigger.config.dead_letter_topic)
            else {
                return None;
            };
            let extra = dead_letter_headers(trigger, msg, topic_id, id, attempts, failure);
            match producer.write_copy(topic, msg, &extra).await {
                Ok((partition, offset)) => {
                    tracing::warn!(
                        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                        partition = msg.partition(), offset = msg.offset(), class = failure.class,
                        dead_letter_topic = %topic, dead_letter_partition = partition,
                        dead_letter_offset = offset, error = %failure.message, "message dead-lettered"
                    );
                    Some(if expired {
                        WorkOutcome::ExpiredDeadLettered
                    } else {
                        WorkOutcome::DeadLettered
                    })
                }
                Err(e) => {
                    let fatal = producer.fatal_error();
                    let reason =
                        match crate::produce::producer::refused_write(&e, fatal.as_ref(), topic) {
                            Some(reason) => {
                                *trigger
                                    .missing_permission
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner()) =
                                    Some((Instant::now(), format!("WRITE on topic {topic}")));
                                reason
                            }
                            None => e.to_string(),
                        };
                    trigger.failed(&format!("cannot write to the dead-letter topic: {reason}"));
                    tracing::error!(
                        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                        partition = msg.partition(), offset = msg.offset(), dead_letter_topic = %topic,
                        error = %reason, "cannot write to the dead-letter topic; the offset is not committed and the write is retried"
                    );
                    None
                }
            }
        }
    }
}

/// The dead letter's header with the original record's topic id, where the cluster has them
/// (`dlq replay` names a batch with it, as the run did).
pub const TOPIC_ID_HEADER: &str = "tessel.topic.id";

/// An operator's skip: why, by which token, and the dispatcher's last answer (status, text).
pub(super) struct OperatorSkip<'a> {
    pub(super) reason: &'a str,
    pub(super) by: &'a str,
    pub(super) last: Option<&'a (Option<u16>, String)>,
}

/// An operator skips the parked record `msg` (`skip.by`: the token's name): a copy goes to the
/// trigger's dead-letter topic with stage `OPERATOR_SKIP`, class `skipped_by_operator`, the
/// reason and the last answer (`tessel.skipped.by` names the token), or, without a
/// dead-letter topic, it is recorded as skipped. Either way it is handled: its offset may be
/// committed and its key goes on. Err: the dead-letter write failed; nothing changed.
pub(super) async fn operator_skip(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    topic_id: Option<&str>,
    id: &str,
    attempts: &Attempts,
    skip: &OperatorSkip<'_>,
) -> Result<(WorkOutcome, Option<crate::control::DeadLetterPosition>), String> {
    let (reason, by, last) = (skip.reason, skip.by, skip.last);
    let last_answer = last.map_or(String::new(), |(_, a)| format!("; last answer: {a}"));
    let (Some(producer), Some(topic)) = (&trigger.producer, &trigger.config.dead_letter_topic)
    else {
        tracing::warn!(
            connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
            partition = msg.partition(), offset = msg.offset(), token = by, reason = %sanitize(reason),
            "record skipped by an operator (the trigger has no dead-letter topic): recorded as skipped, its key goes on"
        );
        return Ok((WorkOutcome::Skipped, None));
    };
    let failure = Failure {
        stage: "OPERATOR_SKIP",
        class: "skipped_by_operator",
        message: format!("skipped by an operator: {reason}{last_answer}"),
        status: last.and_then(|(s, _)| *s),
        schema_id: None,
    };
    let mut extra = dead_letter_headers(trigger, msg, topic_id, id, attempts, &failure);
    extra.push(("tessel.skipped.by".into(), by.to_owned()));
    match producer.write_copy(topic, msg, &extra).await {
        Ok((partition, offset)) => {
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), token = by, reason = %sanitize(reason),
                dead_letter_topic = %topic, dead_letter_partition = partition,
                dead_letter_offset = offset, "record skipped by an operator: dead-lettered, its key goes on"
            );
            let position = crate::control::DeadLetterPosition {
                topic: topic.clone(),
                partition,
                offset,
            };
            Ok((WorkOutcome::DeadLettered, Some(position)))
        }
        Err(e) => {
            let fatal = producer.fatal_error();
            let why = crate::produce::producer::refused_write(&e, fatal.as_ref(), topic)
                .unwrap_or_else(|| e.to_string());
            Err(format!(
                "cannot write to the dead-letter topic {topic}: {why}; the record stays parked"
            ))
        }
    }
}

/// The dead letter's header with the original record's timestamp, in milliseconds since the
/// epoch (absent when the record had none).
pub const ORIGINAL_TIMESTAMP_HEADER: &str = "tessel.original.timestamp.ms";

/// The Kafka Connect error headers (UTF-8 strings) plus the connector's own `tessel.*`.
fn dead_letter_headers(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    topic_id: Option<&str>,
    id: &str,
    attempts: &Attempts,
    failure: &Failure,
) -> Vec<ExtraHeader> {
    let message = sanitize(&failure.message);
    let mut h: Vec<ExtraHeader> = vec![
        ("__connect.errors.topic".into(), msg.topic().to_owned()),
        (
            "__connect.errors.partition".into(),
            msg.partition().to_string(),
        ),
        ("__connect.errors.offset".into(), msg.offset().to_string()),
        (
            "__connect.errors.connector.name".into(),
            format!("tessel-kafka/{}", trigger.connection),
        ),
        ("__connect.errors.stage".into(), failure.stage.to_owned()),
        (
            "__connect.errors.class.name".into(),
            "tessel-kafka".to_owned(),
        ),
        (
            "__connect.errors.exception.class.name".into(),
            format!("tessel.{}", failure.class),
        ),
        ("__connect.errors.exception.message".into(), message),
        ("tessel.trigger".into(), trigger.name.clone()),
        ("tessel.consumer.group".into(), trigger.group.clone()),
        ("tessel.stage".into(), failure.stage.to_owned()),
        ("tessel.error.class".into(), failure.class.to_owned()),
        ("tessel.attempts".into(), attempts.total.to_string()),
        ("tessel.idempotency.key".into(), id.to_owned()),
    ];
    if let Some(s) = failure.status {
        h.push(("tessel.http.status".into(), s.to_string()));
    }
    if let Some(t) = topic_id {
        h.push((TOPIC_ID_HEADER.into(), t.to_owned()));
    }
    if let Some(sid) = failure.schema_id {
        h.push(("tessel.schema.id".into(), sid.to_string()));
    }
    if let Some(t) = msg.timestamp().to_millis() {
        // The copy is written with the time of writing; the record's own time travels here.
        h.push((ORIGINAL_TIMESTAMP_HEADER.into(), t.to_string()));
    }
    if failure.stage == record_age::STAGE {
        let age = record_age::age_ms(msg.timestamp().to_millis(), crate::clock::now_ms());
        h.push((record_age::AGE_HEADER.into(), age.unwrap_or(0).to_string()));
    }
    h
}

/// `max_record_age_ms`: the step for a record older than that (skipped, or handed to the
/// dead-letter path with stage `RECORD_AGE`); None when it may run.
pub(super) fn expired(trigger: &TriggerRuntime, msg: &OwnedMessage) -> Option<Step> {
    let max = trigger.config.max_record_age_ms?;
    let age = record_age::expired(
        msg.timestamp().to_millis(),
        crate::clock::now_ms(),
        Some(max),
    )?;
    tracing::debug!(
        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
        partition = msg.partition(), offset = msg.offset(), age_ms = age,
        "record older than max_record_age_ms; no run"
    );
    Some(match trigger.config.on_expired {
        ExpiredPolicy::Skip => Step::Done(WorkOutcome::Expired),
        ExpiredPolicy::DeadLetter => Step::Fail(Failure {
            stage: record_age::STAGE,
            class: record_age::CLASS,
            message: format!("record is {age} ms old, older than max_record_age_ms = {max}"),
            status: None,
            schema_id: None,
        }),
    })
}

/// One line, bounded, with credentials in URLs (user info, secret query values) removed.
pub(super) fn sanitize(message: &str) -> String {
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::config::redact_text(&one_line)
        .chars()
        .take(500)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{panic_message, sanitize};

    /// A panic inside an attempt is contained where the worker awaits the attempt, and what
    /// it said becomes the failure's message (then the retry policy and `on_error` apply, as
    /// `decide(Observed::Panicked, …)` in `decide`'s tests shows). Tested here rather than through a hook
    /// compiled into the binary the broker tests run.
    #[tokio::test]
    async fn a_panic_in_an_attempt_is_contained_with_its_message() {
        use futures::FutureExt as _;
        let n = 7;
        let caught = std::panic::AssertUnwindSafe(async move {
            assert!(n == 0, "decoder bug at {n}");
        })
        .catch_unwind()
        .await
        .expect_err("the panic is caught");
        assert_eq!(panic_message(&*caught), "decoder bug at 7");
        let caught = std::panic::AssertUnwindSafe(async { panic!("literal") })
            .catch_unwind()
            .await
            .expect_err("the panic is caught");
        assert_eq!(panic_message(&*caught), "literal");
    }

    #[test]
    fn sanitize_removes_credentials_and_newlines() {
        assert_eq!(
            sanitize("GET https://u:p4ss@host/x failed\nnext"),
            "GET https://***@host/x failed next"
        );
        assert_eq!(
            sanitize("error sending request for url (http://user:s3cr3t@host/runs?token=abc&x=1)"),
            "error sending request for url (http://***@host/runs?token=***&x=1)"
        );
        assert_eq!(sanitize("plain"), "plain");
        assert_eq!(sanitize(&"x".repeat(900)).len(), 500);
    }
}
