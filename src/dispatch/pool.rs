//! Dispatcher clients shared per origin: every trigger whose dispatcher has the same origin
//! (scheme, host, port), TLS files and proxy uses one pooled HTTP client, with a bound on the
//! requests in flight (and so the connections in use) and on the idle connections kept.
//!
//! A pool shrinks when the process runs out of file descriptors: to the requests in flight
//! at that moment (the sockets it could open), so the runs wait for connections in use to
//! free up instead of trying new sockets again and again; while every slot is busy, one comes
//! back per second of successful requests, up to the configured bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::http::Connector;
use crate::config::DispatchConfig;

/// How often a pool that shrank gets a slot back while requests succeed.
const GROW_EVERY: Duration = Duration::from_secs(1);
/// How often a pool logs that the process ran out of descriptors.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What makes two dispatchers' connections interchangeable.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct PoolKey {
    /// `scheme://host:port`.
    pub(super) origin: String,
    /// The contents of the CA, client certificate and key files, in that order (a file
    /// replaced between two trigger starts is another identity).
    pub(super) tls: [Option<Vec<u8>>; 3],
    /// The proxy's URI and its `Proxy-Authorization`, when connections are tunnelled.
    pub(super) proxy: Option<(String, Option<Vec<u8>>)>,
}

/// One origin's client and its bounds.
pub(super) struct Pool {
    pub(super) client: Client<Connector, Full<Bytes>>,
    /// One permit per request in flight.
    slots: Semaphore,
    /// Permits the semaphore has in all (in flight or free): `max` less what was given up.
    capacity: AtomicUsize,
    max: usize,
    /// When the pool last grew back, or last shrank.
    last_change: Mutex<Instant>,
    /// When the pool last logged running out of descriptors.
    warned: Mutex<Option<Instant>>,
    /// `scheme://host:port`, for logs.
    origin: String,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("origin", &self.origin)
            .field("capacity", &self.capacity.load(Ordering::Relaxed))
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Pool {
    pub(super) fn new(client: Client<Connector, Full<Bytes>>, max: usize, origin: String) -> Self {
        Self {
            client,
            slots: Semaphore::new(max),
            capacity: AtomicUsize::new(max),
            max,
            last_change: Mutex::new(Instant::now()),
            warned: Mutex::new(None),
            origin,
        }
    }

    /// Waits for a slot: a request may go out while it is held.
    pub(super) async fn slot(&self) -> Option<SemaphorePermit<'_>> {
        self.slots.acquire().await.ok()
    }

    /// How many requests may be in flight now.
    pub(super) fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// A request succeeded: a pool that shrank and has every slot busy grows back by one
    /// slot per [`GROW_EVERY`].
    pub(super) fn succeeded(&self) {
        self.succeeded_at(Instant::now());
    }

    fn succeeded_at(&self, now: Instant) {
        if self.capacity() >= self.max || self.slots.available_permits() > 0 {
            return;
        }
        let mut last = self.last_change.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(*last) < GROW_EVERY {
            return;
        }
        *last = now;
        if self
            .capacity
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c < self.max).then_some(c + 1)
            })
            .is_ok()
        {
            self.slots.add_permits(1);
        }
    }

    /// The request holding `slot` could not open a connection for lack of descriptors: the
    /// pool shrinks to the other requests in flight (the sockets it holds; at least one
    /// slot), giving up this slot and the free ones, and the shortage is logged now and then.
    pub(super) fn out_of_fds(&self, slot: SemaphorePermit<'_>) {
        crate::telemetry::metrics::fds_exhausted();
        {
            let mut last = self.last_change.lock().unwrap_or_else(|p| p.into_inner());
            let capacity = self.capacity();
            // Held by other requests: the capacity less the free slots and this one.
            let others = capacity.saturating_sub(self.slots.available_permits() + 1);
            let target = others.max(1);
            if capacity > target {
                slot.forget();
                let freed = self.slots.forget_permits(capacity - target - 1);
                let _ = self.capacity.fetch_sub(1 + freed, Ordering::Relaxed);
                *last = Instant::now();
            }
        }
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *warned = Some(Instant::now());
            tracing::error!(
                origin = %self.origin,
                allowed = self.capacity(),
                open_fds = crate::limits::open_fds(),
                limit = crate::limits::open_files_limit(),
                "out of file descriptors: a dispatcher connection could not be opened; the \
                 origin's pool allows fewer connections until descriptors free up (raise the \
                 hard open-files limit, or lower dispatch.max_connections_per_origin)"
            );
        }
    }
}

/// Every origin's pool of the daemon, with the bounds of `[dispatch]`. A pool lives while a
/// trigger's dispatcher uses it.
#[derive(Debug, Default)]
pub struct DispatchPools {
    limits: DispatchConfig,
    pools: Mutex<HashMap<PoolKey, Weak<Pool>>>,
}

impl DispatchPools {
    /// Pools bounded by `limits`.
    pub fn new(limits: DispatchConfig) -> Self {
        Self {
            limits,
            pools: Mutex::default(),
        }
    }

    /// The client of the trigger dispatcher `config`, sharing its origin's pool.
    pub fn dispatcher(
        &self,
        config: &crate::config::DispatcherConfig,
    ) -> Result<super::HttpDispatcher, String> {
        super::HttpDispatcher::try_new_in(
            config,
            &hyper_util::client::proxy::matcher::Matcher::from_env(),
            self,
        )
    }

    /// The pool of `key`, built by `build` (with the bounds) when none is alive.
    pub(super) fn get_or_build(
        &self,
        key: PoolKey,
        build: impl FnOnce(&DispatchConfig) -> Result<Pool, String>,
    ) -> Result<Arc<Pool>, String> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pool) = pools.get(&key).and_then(Weak::upgrade) {
            return Ok(pool);
        }
        pools.retain(|_, p| p.strong_count() > 0);
        let pool = Arc::new(build(&self.limits)?);
        let _ = pools.insert(key, Arc::downgrade(&pool));
        Ok(pool)
    }

    /// Pools alive now.
    pub fn len(&self) -> usize {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|p| p.strong_count() > 0)
            .count()
    }

    /// Whether no pool is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::config::DispatcherConfig;
    use crate::dispatch::DispatchOutcome;

    fn config(text: &str) -> DispatcherConfig {
        toml::from_str(text).unwrap()
    }

    fn pools(max: usize) -> DispatchPools {
        DispatchPools::new(DispatchConfig {
            max_connections_per_origin: max,
            max_idle_per_origin: max,
        })
    }

    #[tokio::test]
    async fn triggers_of_one_origin_share_a_pool_and_others_have_their_own() {
        let pools = pools(8);
        let d = |text: &str| pools.dispatcher(&config(text)).unwrap();
        let a = d("url = \"http://127.0.0.1:9/runs\"");
        // Path, query, token, headers and timeout are the trigger's own.
        let b = d("url = \"http://127.0.0.1:9/other?x=1\"\ntoken = \"t\"\ntimeout_ms = 5\nheaders = { X-Tenant = \"b\" }");
        assert!(a.shares_pool_with(&b));
        // Another port, another scheme, a proxy: other pools.
        let port = d("url = \"http://127.0.0.1:10/runs\"");
        let tls = d("url = \"https://127.0.0.1:9/runs\"");
        let proxied = d("url = \"http://127.0.0.1:9/runs\"\nproxy = \"http://127.0.0.1:3128\"");
        for other in [&port, &tls, &proxied] {
            assert!(!a.shares_pool_with(other));
        }
        assert_eq!(pools.len(), 4);
        // A pool lives while a dispatcher uses it.
        drop((a, port, tls, proxied));
        assert_eq!(pools.len(), 1);
        drop(b);
        assert!(pools.is_empty());
    }

    #[tokio::test]
    async fn a_pool_has_at_most_its_bound_of_requests_in_flight() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let server = tokio::spawn({
            let (now, most) = (Arc::clone(&now), Arc::clone(&most));
            async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    let (now, most) = (Arc::clone(&now), Arc::clone(&most));
                    tokio::spawn(async move {
                        while crate::tls::testing::read_request(&mut socket)
                            .await
                            .is_some()
                        {
                            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                            // A dispatcher that takes a moment, so requests overlap.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            now.fetch_sub(1, Ordering::SeqCst);
                            let answer = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
                            if socket.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        let pools = pools(3);
        // Two triggers of one origin, 12 runs each at once.
        let triggers = [
            pools
                .dispatcher(&config(&format!("url = \"http://127.0.0.1:{port}/a\"")))
                .unwrap(),
            pools
                .dispatcher(&config(&format!("url = \"http://127.0.0.1:{port}/b\"")))
                .unwrap(),
        ];
        let runs = (0..24).map(|i| {
            let d = triggers[i % 2].clone();
            async move {
                d.dispatch(b"{}".to_vec(), &format!("kafka:g:t:0:{i}"), None)
                    .await
            }
        });
        let outcomes = futures::future::join_all(runs).await;
        assert!(outcomes
            .iter()
            .all(|o| matches!(o, DispatchOutcome::Accepted { .. })));
        assert_eq!(most.load(Ordering::SeqCst), 3, "requests in flight at most");
        server.abort();
    }

    #[tokio::test]
    async fn running_out_of_descriptors_shrinks_the_pool_and_success_grows_it_back() {
        let pools = pools(3);
        let d = pools
            .dispatcher(&config("url = \"http://127.0.0.1:9/runs\""))
            .unwrap();
        let pool = &d.pool;
        // Two requests in flight hold their sockets; a third cannot open one: the pool
        // shrinks to the two at once (not by one slot per failure).
        let (a, b) = (pool.slot().await.unwrap(), pool.slot().await.unwrap());
        let third = pool.slot().await.unwrap();
        pool.out_of_fds(third);
        assert_eq!((pool.capacity(), pool.slots.available_permits()), (2, 0));
        drop(a);
        let again = pool.slot().await.unwrap();
        pool.out_of_fds(again);
        assert_eq!(pool.capacity(), 1, "to the one still in flight");
        drop(b);
        let last = pool.slot().await.unwrap();
        pool.out_of_fds(last);
        assert_eq!(
            (pool.capacity(), pool.slots.available_permits()),
            (1, 1),
            "never below one slot"
        );
        let shrank_at = *pool.last_change.lock().unwrap();
        let busy = pool.slot().await.unwrap();
        // Within a second of the last change: no growth; then one slot per second while
        // every slot is busy.
        pool.succeeded_at(shrank_at + Duration::from_millis(500));
        assert_eq!(pool.capacity(), 1);
        pool.succeeded_at(shrank_at + Duration::from_millis(1_000));
        assert_eq!(pool.capacity(), 2);
        let busy_too = pool.slot().await.unwrap();
        pool.succeeded_at(shrank_at + Duration::from_millis(1_500));
        assert_eq!(pool.capacity(), 2);
        pool.succeeded_at(shrank_at + Duration::from_millis(2_000));
        assert_eq!(pool.capacity(), 3);
        drop((busy, busy_too));
        // A free slot: no need to grow.
        pool.succeeded_at(shrank_at + Duration::from_millis(9_000));
        assert_eq!((pool.capacity(), pool.slots.available_permits()), (3, 3));
    }
}
