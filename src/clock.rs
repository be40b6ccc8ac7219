//! The clocks and the random draws, read by the shell alone: the core ([`crate::core`])
//! takes every time it needs as an argument, and the shell's clock and draws follow a
//! simulated schedule's time and seed, so that the schedule replays exactly.

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

thread_local! {
    /// The thread's seeded source of draws (splitmix64's state), when a simulated schedule
    /// seeded it; None: the process's random source.
    static SEEDED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// A draw for jitter, retry nonces and the like: uniform over `u64`. From the process's
/// random source, unless this thread's draws were seeded ([`seed_draws`]).
pub fn draw_u64() -> u64 {
    SEEDED.with(|s| match s.get() {
        None => rand::random(),
        Some(state) => {
            let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            s.set(Some(state));
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    })
}

/// A draw uniform in [0, 1) (see [`draw_u64`]).
pub fn draw() -> f64 {
    // 53 bits: every value a f64 in [0, 1) can take at this spacing.
    (draw_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A draw uniform in [0, n) (see [`draw_u64`]); 0 when `n` is 0.
pub fn draw_below(n: u64) -> u64 {
    draw_u64() % n.max(1)
}

/// Seeds this thread's draws: a simulated schedule, whose tasks all run on this thread,
/// replays its jitter from its seed. None: the process's random source again.
pub fn seed_draws(seed: Option<u64>) {
    SEEDED.with(|s| s.set(seed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_draws_replay_and_stay_in_range() {
        seed_draws(Some(7));
        let first: Vec<u64> = (0..5).map(|_| draw_u64()).collect();
        seed_draws(Some(7));
        let again: Vec<u64> = (0..5).map(|_| draw_u64()).collect();
        assert_eq!(first, again);
        for _ in 0..1000 {
            let d = draw();
            assert!((0.0..1.0).contains(&d), "{d}");
            assert!(draw_below(20) < 20);
        }
        seed_draws(None);
    }
}
