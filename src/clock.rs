//! The clocks, read by the shell alone: the core ([`crate::core`]) takes every time it needs
//! as an argument, so that a simulated schedule replays exactly from its seed.

/// The shell's monotonic clock: tokio's, which a runtime with paused time advances (a
/// simulated schedule runs the shell so), and the system's otherwise. The shell reads no
/// other monotonic clock.
pub fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
