//! Per-message spans, exported over OTLP when `[otlp]` is configured: `consume` (the
//! message, continuing its `traceparent`), with children `decode`, `dispatch` (one per
//! attempt) and `commit` (the offset handed to the commit pipeline). Without `[otlp]` they are
//! not created at all ([`exporting`]). A batch trigger's batch is one `consume` span linked
//! to each record's trace (`run::span::consume_span`, where runs make them), with `decode`
//! children and a `dispatch` child per request.

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
