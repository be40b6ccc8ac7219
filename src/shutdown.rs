//! The only place that listens to OS signals. The first SIGINT or SIGTERM cancels the token
//! (drain, commit, exit 0); a second one exits at once. SIGHUP asks for a configuration
//! reload.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Exit code when a second signal cuts the drain short.
pub const FORCED_EXIT_CODE: i32 = 130;

/// Cancels `token` on the first signal and exits the process on the second.
pub fn spawn_signal_handler(token: CancellationToken) {
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        }
        token.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(FORCED_EXIT_CODE);
    });
}

/// Sends on `reload` at every SIGHUP, until the channel closes.
pub fn spawn_reload_signal(reload: tokio::sync::mpsc::Sender<&'static str>) {
    tokio::spawn(async move {
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::error!("cannot install the SIGHUP handler: reload with the config file watch or POST /-/reload");
            return;
        };
        while hup.recv().await.is_some() {
            if reload.send("SIGHUP").await.is_err() {
                return;
            }
        }
    });
}
