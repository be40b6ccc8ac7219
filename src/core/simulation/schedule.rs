//! The shape of a simulated schedule, drawn from its seed: the random source, the
//! parameters (made smaller when shrinking) and the records of the logs.

use std::time::Duration;

use super::world::World;
use crate::core::batch::BatchLimits;
use crate::core::types::Ordering;

/// splitmix64: small, fast, and the same on every machine.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The group protocol a schedule's coordinator runs (`../shared/notes/simulation-anchors.md`
/// §4 has the broker's rules and their sources).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    /// Classic, dynamic members: a rebalance is a new generation for every member, a commit
    /// of another generation is refused (ILLEGAL_GENERATION), one of a member the group no
    /// longer knows too (UNKNOWN_MEMBER_ID: killed, or restarted under a new member id), and
    /// a killed member's session expires at once.
    Classic,
    /// Classic with `group.instance.id`: a killed member keeps its partitions (unread) for
    /// `session_steps`; its commits still on the way are applied meanwhile. A restart before
    /// then takes them back in the same generation, with no rebalance, and fences the old
    /// incarnation (its later commits: FENCED_INSTANCE_ID).
    Static { session_steps: u64 },
    /// KIP-848: each member has its own epoch, and only members whose assignment changes
    /// move to a new one (the revoking member once it released the partition); no
    /// REBALANCE_IN_PROGRESS. A commit is checked against the member's epoch: strictly
    /// (any other epoch: STALE_MEMBER_EPOCH), or per partition as KIP-1251 relaxes it (the
    /// epoch the partition was assigned at ≤ the request's ≤ the member's).
    Consumer { relaxed: bool },
}

impl Protocol {
    /// Drawn from its own stream: adding it changed no other parameter of a seed.
    fn from_seed(seed: u64) -> Self {
        let mut r = Rng(seed ^ 0x0848);
        match r.below(6) {
            0..=2 => Protocol::Classic,
            3 => Protocol::Static {
                session_steps: 5 + r.below(200),
            },
            4 => Protocol::Consumer { relaxed: false },
            _ => Protocol::Consumer { relaxed: true },
        }
    }
}

/// Which offsets of a schedule's logs the consumer never returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gaps {
    /// About one in twelve: aborted records and their markers.
    Sparse,
    /// One record per transaction: every record followed by its commit marker.
    Transactional,
    /// A compacted log: about three offsets in five are gone.
    Compacted,
}

/// The shape of one schedule, drawn from its seed (and made smaller when shrinking).
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub(super) seed: u64,
    pub(super) partitions: i32,
    pub(super) records: usize,
    pub(super) keys: u64,
    pub(super) members: usize,
    /// Steps with faults (kills, handovers, parked keys); then only progress.
    pub(super) fault_steps: usize,
    pub(super) ordering: Ordering,
    pub(super) concurrency: usize,
    pub(super) per_partition: usize,
    pub(super) max_tracked_above: usize,
    /// A batch trigger's bounds (simulated milliseconds), or None: single records.
    pub(super) batch: Option<BatchLimits>,
    pub(super) protocol: Protocol,
    /// The trigger's `on_error`: "dead_letter" (a refused record is written to the
    /// dead-letter topic and counts as handled), or "block" (its key holds, as a 5xx's).
    pub(super) dead_letter: bool,
    /// What Kafka and librdkafka do outside the group protocol (`world.rs`).
    pub(super) world: World,
    /// Offsets never returned; with `metadata_max_chars` they can fill the commit metadata.
    pub(super) gaps: Gaps,
    /// The connection's `commit_metadata_max_bytes` (the broker's
    /// `offset.metadata.max.bytes`): the default, or a few characters, so that a schedule
    /// fills it.
    pub(super) metadata_max_chars: usize,
    /// A new owner may be handed commit metadata that is not the group's last commit's:
    /// foreign, cut short, not UTF-8, of another form or offset, or the same map in the
    /// older `tk1` form.
    pub(super) metadata_faults: bool,
}

impl Params {
    /// The gaps and the commit metadata's budget and faults, drawn from their own stream
    /// (adding them changed no other draw of a seed).
    fn with_metadata_draws(self) -> Self {
        let mut r = Rng(self.seed ^ 0x7A95);
        Self {
            gaps: match r.below(10) {
                0..=3 => Gaps::Sparse,
                4..=6 => Gaps::Transactional,
                _ => Gaps::Compacted,
            },
            // Below about nine characters not even a map's header fits: no map, and a
            // partition runs nothing past a record it waits on.
            metadata_max_chars: if r.chance(60) {
                crate::core::offsets::DEFAULT_METADATA_MAX_CHARS
            } else {
                r.below(30) as usize
            },
            metadata_faults: r.chance(25),
            ..self
        }
    }

    /// The schedule of `seed` as it was before the metadata draws: sparse gaps, the default
    /// budget, no metadata faults (what the regression seeds found their failures in).
    pub(super) fn without_metadata_draws(self) -> Self {
        Self {
            gaps: Gaps::Sparse,
            metadata_max_chars: crate::core::offsets::DEFAULT_METADATA_MAX_CHARS,
            metadata_faults: false,
            ..self
        }
    }

    pub(super) fn from_seed(seed: u64) -> Self {
        let mut r = Rng(seed ^ 0x5EED);
        let p = Self {
            seed,
            partitions: 1 + r.below(3) as i32,
            records: 20 + r.below(120) as usize,
            keys: 1 + r.below(8),
            members: 1 + r.below(3) as usize,
            fault_steps: 50 + r.below(400) as usize,
            ordering: match r.below(3) {
                0 => Ordering::Key,
                1 => Ordering::Partition,
                _ => Ordering::Unordered,
            },
            concurrency: 1 + r.below(8) as usize,
            per_partition: 2 + r.below(20) as usize,
            max_tracked_above: 2 + r.below(12) as usize,
            // One schedule in three: a batch trigger (partition order, one batch of a
            // partition at a time; a batch's records are handled one by one).
            batch: r.chance(33).then(|| BatchLimits {
                max_records: 1 + r.below(6) as usize,
                max_bytes: 1 << 20,
                max_wait: Duration::from_millis(r.below(40)),
            }),
            protocol: Protocol::from_seed(seed),
            dead_letter: Rng(seed ^ 0xDEAD).chance(50),
            world: World::from_seed(seed),
            gaps: Gaps::Sparse,
            metadata_max_chars: crate::core::offsets::DEFAULT_METADATA_MAX_CHARS,
            metadata_faults: false,
        }
        .with_metadata_draws();
        // As the configuration guarantees (`config::MAX_CONCURRENCY`, and
        // `config::MAX_BATCH_RECORDS`): a trigger's records in flight (its runs, or a batch
        // partition's one batch) fit the commit metadata's bound above a full gap.
        let in_flight = p.concurrency.max(p.batch.map_or(0, |b| b.max_records));
        Self {
            max_tracked_above: p.max_tracked_above.max(in_flight),
            ..p
        }
    }
}

/// One record of a partition's log: a data record, or one the consumer never returns (an
/// aborted transaction's record or a transaction marker).
#[derive(Clone, Copy, Debug)]
pub(super) struct LogRecord {
    pub(super) key: u64,
    pub(super) data: bool,
}
