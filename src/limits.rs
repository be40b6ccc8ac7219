//! The process's open-files limit and the descriptors it holds.
//!
//! A region's descriptors grow with its work: every librdkafka client holds a socket per
//! broker it talks to and a few wake-up descriptors, and every dispatcher connection a socket.
//! The daemon raises its soft `RLIMIT_NOFILE` to the hard limit when it starts (the soft limit
//! is often 1,024 while the hard one is far higher), exports what it holds and its limit as
//! metrics, and tells running out of descriptors (`EMFILE`, `ENFILE`) from other connection
//! errors.

// getrlimit and setrlimit: two system calls on a local struct, nothing else.
#![allow(unsafe_code)]

/// The open-files limit before and after [`raise_open_files_limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (the most the soft limit may be raised to without privileges).
    pub hard: u64,
}

/// The soft and hard `RLIMIT_NOFILE`, `RLIM_INFINITY` as `u64::MAX`.
fn get() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given, which lives for the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Raises the soft open-files limit to the hard limit. Called once, first thing in `main`.
pub fn raise_open_files_limit() -> std::io::Result<OpenFilesLimit> {
    let (before, hard) = get()?;
    if before < hard {
        let limit = libc::rlimit {
            rlim_cur: hard,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads the struct it is given, which lives for the call.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let (soft, hard) = get()?;
    Ok(OpenFilesLimit { before, soft, hard })
}

/// What [`raise_open_files_limit`] did at start, for the daemon to log once logging is set up.
static AT_START: std::sync::OnceLock<Result<OpenFilesLimit, String>> = std::sync::OnceLock::new();

/// Raises the limit (see [`raise_open_files_limit`]) and keeps the outcome for
/// [`log_at_start`].
pub fn raise_at_start() {
    let _ = AT_START.set(raise_open_files_limit().map_err(|e| e.to_string()));
}

/// Logs what [`raise_at_start`] did (nothing when it was not called).
pub fn log_at_start() {
    match AT_START.get() {
        Some(Ok(l)) if l.before < l.soft => tracing::info!(
            from = l.before,
            to = l.soft,
            hard = l.hard,
            "open-files limit raised to the hard limit"
        ),
        Some(Ok(l)) => tracing::info!(
            soft = l.soft,
            hard = l.hard,
            "open-files limit already at the hard limit"
        ),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit; it stays as it was")
        }
        None => {}
    }
}

/// The soft open-files limit now (None when it cannot be read or is unlimited).
pub fn open_files_limit() -> Option<u64> {
    get()
        .ok()
        .map(|(soft, _)| soft)
        .filter(|s| *s != libc::RLIM_INFINITY)
}

/// How many descriptors the process holds (None where `/proc/self/fd` cannot be read).
pub fn open_fds() -> Option<u64> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    // The directory's own descriptor, open while it is read, is not counted.
    Some((dir.count() as u64).saturating_sub(1))
}

/// Whether `e`, or an error it wraps, says the process or the system ran out of file
/// descriptors.
pub fn out_of_fds(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                return true;
            }
            // An io::Error's source() skips the error it holds: step into it.
            if let Some(inner) = io.get_ref() {
                cur = Some(inner as &(dyn std::error::Error + 'static));
                continue;
            }
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_and_descriptors_are_counted() {
        let l = raise_open_files_limit().unwrap();
        assert_eq!(l.soft, l.hard, "{l:?}");
        assert!(l.before <= l.soft);
        // Other tests open and close descriptors meanwhile: only that some are counted.
        assert!(open_fds().unwrap() >= 3);
        assert_eq!(
            open_files_limit(),
            Some(l.soft).filter(|s| *s != libc::RLIM_INFINITY)
        );
    }

    #[test]
    fn running_out_of_descriptors_is_told_from_other_errors() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(out_of_fds(&emfile));
        let wrapped = std::io::Error::other(std::io::Error::from_raw_os_error(libc::ENFILE));
        assert!(out_of_fds(&wrapped));
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert!(!out_of_fds(&refused));
    }
}
