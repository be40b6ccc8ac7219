//! Logs (tracing, text or JSON), traces (OpenTelemetry over OTLP/HTTP, optional) and metrics
//! (Prometheus). Metric names live in [`metrics`]; per-message spans in [`trace`].

pub mod metrics;
pub mod trace;

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{fmt, EnvFilter, Layer as _};

use crate::config::{LogConfig, LogFormat, OtlpConfig, OtlpProtocol};

/// Keeps trace export running; [`Telemetry::shutdown`] sends what is buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the trace exporter (blocking; run off the async threads).
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            let _ = std::thread::spawn(move || {
                if let Err(e) = p.shutdown() {
                    eprintln!("trace export shutdown: {e}");
                }
            })
            .join();
        }
    }
}

/// The AWS crates' targets that log credentials they load: aws-config's profile provider
/// names the access key id at `info` and `debug` (the secret is redacted).
const AWS_CREDENTIAL_TARGETS: &[&str] = &["aws_config", "aws_runtime", "aws_sdk_sts"];

/// `filter` with the AWS crates capped at `warn`, unless it names one of their targets itself
/// (an explicit `aws_config=debug` is the operator's choice).
pub fn quiet_aws_credentials(filter: EnvFilter) -> EnvFilter {
    let text = filter.to_string();
    AWS_CREDENTIAL_TARGETS
        .iter()
        .filter(|t| !text.contains(*t))
        .fold(filter, |f, t| {
            f.add_directive(format!("{t}=warn").parse().expect("a valid directive"))
        })
}

/// Installs the global tracing subscriber: log lines to stderr (`RUST_LOG` wins over the
/// configured level) and, with `otlp`, message spans to the collector.
pub fn init_tracing(config: &LogConfig, otlp: Option<&OtlpConfig>) -> Telemetry {
    // The trace target's spans never reach the log. A directive (not a filter function)
    // keeps callsite interest static, so disabled log macros stay a cached no-op.
    let hide_traces = format!("{}=off", trace::TARGET)
        .parse()
        .expect("a valid directive");
    let filter = quiet_aws_credentials(
        EnvFilter::try_from_default_env()
            .or_else(|_| EnvFilter::try_new(&config.level))
            .unwrap_or_else(|_| EnvFilter::new("info")),
    )
    .add_directive(hide_traces);
    let log = match config.format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => fmt::layer()
            .with_ansi(text_colour(std::io::stderr().is_terminal()))
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    };
    let (provider, error) = match otlp.map(build_provider) {
        Some(Ok(p)) => (Some(p), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("tessel-kafka"))
            .with_filter(Targets::new().with_target(trace::TARGET, tracing::Level::INFO))
    });
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(otel)
        .try_init();
    if let Some(e) = error {
        tracing::error!(error = %e, "OTLP trace export is off: the exporter could not be built");
    } else if let Some(o) = otlp {
        trace::set_exporting();
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        tracing::info!(endpoint = %o.traces_url(), protocol = ?o.protocol, "exporting traces over OTLP");
    }
    Telemetry { provider }
}

/// Whether text log lines carry ANSI colour: only on a terminal (in a file, a pipe or a
/// container's log every escape sequence would be noise), and never with `NO_COLOR` set to a
/// non-empty value (the no-color convention, which tracing-subscriber honours by default).
fn text_colour(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn build_provider(o: &OtlpConfig) -> Result<SdkTracerProvider, String> {
    let headers: HashMap<String, String> = o
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.expose().to_owned()))
        .collect();
    let protocol = match o.protocol {
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
        OtlpProtocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
    };
    let url = o.traces_url();
    let timeout = Duration::from_millis(o.timeout_ms);
    // The exporter's blocking HTTP client must be built outside the async runtime.
    let exporter = std::thread::spawn(move || {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .with_protocol(protocol)
            .with_timeout(timeout)
            .with_headers(headers)
            .build()
            .map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the exporter builder panicked".to_owned())??;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_millis(o.export_interval_ms))
                .build(),
        )
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(o.service_name.clone())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            o.sample_ratio,
        ))))
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    #[test]
    fn aws_crates_are_capped_at_warn_unless_the_filter_names_them() {
        let f = quiet_aws_credentials(EnvFilter::new("debug")).to_string();
        for t in AWS_CREDENTIAL_TARGETS {
            assert!(f.contains(&format!("{t}=warn")), "{f}");
        }
        let f = quiet_aws_credentials(EnvFilter::new("info,aws_config=debug")).to_string();
        assert!(
            f.contains("aws_config=debug") && !f.contains("aws_config=warn"),
            "{f}"
        );
    }
}
