//! Wakes the poll task when librdkafka has something for it, instead of on a timer.
//!
//! librdkafka writes a payload to an application's file descriptor when an element lands on
//! an empty queue (`rd_kafka_queue_io_event_enable`), once until the queue is polled again.
//! The consumer queue is the last queue of the consumer's forward chain (rust-rdkafka routes
//! the main queue, with logs, statistics and rebalances, into it), so one eventfd carries
//! every reason to poll. The same eventfd is written to stop the task.
//!
//! Unsafe: librdkafka's queue API through rdkafka-sys, and eventfd/poll through libc.
#![allow(unsafe_code)]

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::consumer::context::ConnectorContext;

/// What librdkafka writes: an eventfd accepts only 8-byte writes, and adds them up.
static PAYLOAD: u64 = 1;

/// An eventfd librdkafka writes to when the consumer's queue gets an element.
pub(crate) struct QueueWake {
    fd: OwnedFd,
    /// A reference to the consumer queue, held while its events are enabled.
    queue: *mut rdsys::rd_kafka_queue_t,
}

// The queue reference is only used to enable, measure and disable io events, which
// librdkafka does under the queue's lock; the handle is owned by one thread at a time.
unsafe impl Send for QueueWake {}

/// The half that wakes the poll task from elsewhere (to stop it).
#[derive(Clone)]
pub(crate) struct Waker {
    fd: std::sync::Arc<OwnedFd>,
}

impl QueueWake {
    /// Creates the eventfd and has librdkafka write to it when `consumer`'s queue gets an
    /// element. The returned waker shares the eventfd.
    pub(crate) fn enable(
        consumer: &BaseConsumer<ConnectorContext>,
    ) -> std::io::Result<(Self, Waker)> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let stop_fd = fd.try_clone()?;
        // SAFETY: the consumer's handle is valid while `consumer` lives; the queue reference
        // is destroyed in Drop, which the poll task runs before the consumer is dropped.
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        if queue.is_null() {
            return Err(std::io::Error::other("the consumer has no consumer queue"));
        }
        // SAFETY: librdkafka copies the payload; the fd outlives the enablement (Drop
        // disables it before the fd is closed).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(
                queue,
                fd.as_raw_fd(),
                std::ptr::from_ref(&PAYLOAD).cast(),
                std::mem::size_of::<u64>(),
            );
        }
        let waker = Waker {
            fd: std::sync::Arc::new(stop_fd),
        };
        Ok((Self { fd, queue }, waker))
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
        // SAFETY: the queue reference is valid until Drop.
        unsafe { rdsys::rd_kafka_queue_length(self.queue) }
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

impl Drop for QueueWake {
    fn drop(&mut self) {
        // SAFETY: disable before the fd closes, then release the queue reference (before
        // the consumer closes).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.queue, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.queue);
        }
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
