//! A trigger's filter applied to a run's record. The expression language itself (compiling,
//! evaluating) is [`crate::config::filter`]: a filter is compiled when the configuration loads.

use rdkafka::message::{Message, OwnedMessage};

use crate::codec::Decoded;
use crate::config::filter::{FilterInput, Verdict};
use crate::dispatch::event::EventHeader;
use crate::run::{TriggerRuntime, WorkOutcome};

/// A trigger's filter on a decoded record: None when the record may start a run (no filter,
/// or it matches), else how it was handled. The worker's one call into this module.
pub(crate) fn screen(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    headers: &[EventHeader],
    key: &Decoded,
    value: &Decoded,
) -> Option<WorkOutcome> {
    let filter = trigger.config.filter.as_ref()?;
    let input = FilterInput {
        key: &key.value,
        value: &value.value,
        headers,
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp_ms: msg.timestamp().to_millis(),
    };
    match filter.evaluate(&input) {
        Verdict::Match => None,
        Verdict::NoMatch => Some(WorkOutcome::Filtered),
        Verdict::Error(reason) => {
            if filter.first_error() {
                tracing::warn!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), error = %reason,
                    "the filter cannot be evaluated on this record; counted as not matching (outcome=\"filter_error\"; said once per trigger, then at debug)"
                );
            } else {
                tracing::debug!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), error = %reason,
                    "the filter cannot be evaluated on this record; counted as not matching"
                );
            }
            Some(WorkOutcome::FilterError)
        }
    }
}
