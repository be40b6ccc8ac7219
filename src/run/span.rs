//! The `consume` span of a run, continuing (or, for a batch, linking) the trace context its
//! records carry (see [`crate::telemetry::trace`] for the spans and their export).

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::telemetry::trace::{exporting, TARGET};

/// The `consume` span of a run. A single trigger's record: its span, child of the record's
/// `traceparent` header when it has one. A batch (`batch`): one span for its records, linked
/// to the trace of each record that carries a `traceparent` (OpenTelemetry's messaging
/// conventions for batch processing: one run cannot be the child of several traces), and the
/// run continues the trace of the batch's `dispatch` span.
pub(crate) fn consume_span(
    connection: &str,
    group: &str,
    trigger: &str,
    msgs: &[rdkafka::message::OwnedMessage],
    batch: bool,
) -> tracing::Span {
    use opentelemetry::trace::TraceContextExt as _;
    use rdkafka::message::Message as _;
    let (Some(first), Some(last)) = (msgs.first(), msgs.last()) else {
        return tracing::Span::none();
    };
    if !exporting() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "consume",
        otel.name = %format!("process {}", first.topic()),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.destination.name = %first.topic(),
        messaging.destination.partition.id = first.partition(),
        messaging.kafka.offset = tracing::field::Empty,
        messaging.batch.message_count = tracing::field::Empty,
        messaging.consumer.group.name = %group,
        tessel.connection = %connection,
        tessel.trigger = %trigger,
        tessel.batch.first_offset = tracing::field::Empty,
        tessel.batch.last_offset = tracing::field::Empty,
        tessel.outcome = tracing::field::Empty,
    );
    if batch {
        // As i64: tracing-opentelemetry exports unsigned integers as strings.
        span.record("messaging.batch.message_count", msgs.len() as i64);
        span.record("tessel.batch.first_offset", first.offset());
        span.record("tessel.batch.last_offset", last.offset());
    } else {
        span.record("messaging.kafka.offset", first.offset());
    }
    if span.is_disabled() {
        return span;
    }
    let propagator = TraceContextPropagator::new();
    for msg in msgs {
        let carrier = trace_headers(msg);
        if !carrier.contains_key("traceparent") {
            continue;
        }
        let context = propagator.extract(&carrier);
        if !batch {
            let _ = span.set_parent(context);
            continue;
        }
        let linked = context.span().span_context().clone();
        if linked.is_valid() {
            span.add_link(linked);
        }
    }
    span
}

/// The record's `traceparent` and `tracestate` headers (names lowercased), for extraction.
fn trace_headers(msg: &rdkafka::message::OwnedMessage) -> HashMap<String, String> {
    let mut carrier = HashMap::new();
    for h in crate::codec::headers::raw_headers(msg) {
        // A name that is not UTF-8 is not trace context (and must not panic: see
        // `codec::headers`).
        let Ok(name) = std::str::from_utf8(h.name) else {
            continue;
        };
        let name = name.to_ascii_lowercase();
        if matches!(name.as_str(), "traceparent" | "tracestate") {
            if let Some(v) = h.value.and_then(|v| std::str::from_utf8(v).ok()) {
                let _ = carrier.insert(name, v.to_owned());
            }
        }
    }
    carrier
}
