//! Logs (tracing, text or JSON) and metrics (Prometheus). Metric names live in [`metrics`].

pub mod metrics;

use tracing_subscriber::{fmt, EnvFilter};

use crate::config::{LogConfig, LogFormat};

/// Installs the global tracing subscriber. `RUST_LOG` wins over the configured level.
pub fn init_tracing(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match config.format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
