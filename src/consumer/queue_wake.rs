//! Wakes the poll task when librdkafka has something for it, instead of on a timer.
//!
//! librdkafka writes a payload to an application's file descriptor when an element lands on
//! an empty queue (`rd_kafka_queue_io_event_enable`), once until the queue is polled again.
//! The consumer queue is the last queue of the consumer's forward chain (rust-rdkafka routes
//! the main queue, with logs, statistics and rebalances, into it), so one eventfd carries
//! every reason to poll. The same eventfd is written to stop the task.
//!
//! Unsafe: eventfd/poll through libc (the queue's side is the port's, see
//! [`KafkaPort::wake_on`]).
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::consumer::port::KafkaPort;

/// An eventfd the consumer writes to when its queue gets an element.
pub(crate) struct QueueWake<P: KafkaPort> {
    fd: OwnedFd,
    /// The consumer, told to stop writing before the fd closes.
    port: Arc<P>,
}

/// The half that wakes the poll task from elsewhere (to stop it).
#[derive(Clone)]
pub(crate) struct Waker {
    fd: Arc<OwnedFd>,
}

impl<P: KafkaPort> QueueWake<P> {
    /// Creates the eventfd and has the consumer of `port` write to it when its queue gets an
    /// element. The returned waker shares the eventfd.
    pub(crate) fn enable(port: &Arc<P>) -> std::io::Result<(Self, Waker)> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let stop_fd = fd.try_clone()?;
        // The fd outlives the enablement: Drop disables it before the fd is closed.
        port.wake_on(Some(fd.as_raw_fd()));
        let waker = Waker {
            fd: Arc::new(stop_fd),
        };
        let port = Arc::clone(port);
        Ok((Self { fd, port }, waker))
    }

    /// Waits on this thread until librdkafka (or the waker) wrote, or `timeout`; clears what
    /// was written.
    pub(crate) fn wait(&self, timeout: std::time::Duration) {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ready > 0 {
            let _ = read(&self.fd);
        }
    }

    /// The eventfd, registered with the runtime's reactor (readable when written). Call
    /// within the runtime.
    pub(crate) fn register(&self) -> std::io::Result<AsyncFd<OwnedFd>> {
        let fd = self.fd.try_clone()?;
        // SAFETY: an OwnedFd stays open, and is the same descriptor, until the AsyncFd that
        // owns it is dropped.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
    }

    /// Elements waiting in the consumer queue.
    pub(crate) fn queued(&self) -> usize {
        self.port.queued()
    }
}

/// Reads (and so clears) what was written to the eventfd `fd`; `WouldBlock` when nothing was.
pub(crate) fn read(fd: &OwnedFd) -> std::io::Result<()> {
    let mut counter = 0u64;
    // SAFETY: an 8-byte read into a u64 from a non-blocking eventfd.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            std::ptr::from_mut(&mut counter).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl<P: KafkaPort> Drop for QueueWake<P> {
    fn drop(&mut self) {
        // Stop the writes before the fd closes (its number could be reused).
        self.port.wake_on(None);
    }
}

impl Waker {
    /// Wakes the waiting task.
    pub(crate) fn wake(&self) {
        let one = 1u64;
        // SAFETY: an 8-byte write to an eventfd; a full counter (never here) only fails.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                std::ptr::from_ref(&one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}
