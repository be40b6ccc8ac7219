//! Per-message spans, exported over OTLP when `[otlp]` is configured: `consume` (the
//! message, continuing its `traceparent`), with children `decode`, `dispatch` (one per
//! attempt) and `commit` (the offset handed to the commit pipeline). Without `[otlp]` they are
//! not created at all ([`exporting`]). A batch trigger's batch is one `consume` span linked
//! to each record's trace ([`consume_span`]), with `decode` children and a `dispatch` child
//! per request.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The target of every trace span; the log layer leaves it out.
pub const TARGET: &str = "tessel_kafka::trace";

static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether spans are exported (an OTLP layer is installed). Per-message spans are created
/// only then: measured, a disabled-but-created span per message and per attempt cost about 5%
/// of the connector's CPU (registry bookkeeping, `Instrumented` drops).
pub fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Records that spans are exported from now on.
pub(crate) fn set_exporting() {
    EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The `consume` span of a run. A single trigger's record: its span, child of the record's
/// `traceparent` header when it has one. A batch (`batch`): one span for its records, linked
/// to the trace of each record that carries a `traceparent` (OpenTelemetry's messaging
/// conventions for batch processing: one run cannot be the child of several traces), and the
/// run continues the trace of the batch's `dispatch` span.
pub fn consume_span(
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

/// The W3C `traceparent` of `span` when it is exported, to forward to the dispatcher so the
/// run continues the trace; `None` when tracing is off.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}
