//! The simulation's schedules as tests: shrinking, the regression seeds, many seeds on every
//! core, and the handover wedge by construction.

use super::*;

/// Runs the schedule of `p`; on a violation, shrinks it and panics with the smallest.
fn run_or_shrink(p: Params) -> Result<(), String> {
    let Err(first) = Sim::new(p).run() else {
        return Ok(());
    };
    let mut smallest = (p, first);
    loop {
        let mut shrunk = false;
        let cur = smallest.0;
        let candidates = [
            Params {
                records: cur.records / 2,
                ..cur
            },
            Params {
                fault_steps: cur.fault_steps / 2,
                ..cur
            },
            Params {
                members: cur.members.saturating_sub(1).max(1),
                ..cur
            },
            Params {
                partitions: (cur.partitions - 1).max(1),
                ..cur
            },
            Params { batch: None, ..cur },
        ];
        let shape = |p: &Params| {
            (
                p.records,
                p.fault_steps,
                p.members,
                p.partitions,
                p.batch.is_some(),
            )
        };
        for c in candidates {
            if c.records < 2 || shape(&c) == shape(&cur) {
                continue;
            }
            if let Err(v) = Sim::new(c).run() {
                smallest = (c, v);
                shrunk = true;
                break;
            }
        }
        if !shrunk {
            return Err(format!("{:?}\n  {}", smallest.0, (smallest.1).0));
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Each regression seed under every group protocol (most were found under the classic one,
/// before the others were simulated), with its gaps and commit metadata as drawn and as
/// they were before those were drawn (sparse gaps, the default budget: what the seeds
/// before issue 34 found their failures in).
#[test]
fn regression_seeds_hold() {
    let protocols = [
        Protocol::Classic,
        Protocol::Static { session_steps: 60 },
        Protocol::Consumer { relaxed: false },
        Protocol::Consumer { relaxed: true },
    ];
    for &seed in REGRESSION_SEEDS {
        for protocol in protocols {
            let drawn = Params {
                protocol,
                ..Params::from_seed(seed)
            };
            for p in [drawn, drawn.without_metadata_draws()] {
                if let Err(e) = run_or_shrink(p) {
                    panic!("regression seed {seed} under {protocol:?}: {e}");
                }
            }
        }
    }
}

#[test]
fn simulated_schedules_keep_every_invariant() {
    let schedules = env_u64("TESSEL_SIM_SCHEDULES", 3_000);
    let first = env_u64("TESSEL_SIM_FIRST_SEED", 1);
    // Seeds are independent: each thread takes every n-th one.
    let threads = env_u64(
        "TESSEL_SIM_THREADS",
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    )
    .max(1);
    let started = std::time::Instant::now();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    let mut seed = first + t;
                    while seed < first + schedules && failures.len() < 3 {
                        if let Err(e) = run_or_shrink(Params::from_seed(seed)) {
                            failures.push(format!("seed {seed}: {e}"));
                        }
                        seed += threads;
                    }
                    failures
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|_| vec!["a thread panicked".into()])
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "simulation: {schedules} schedules from seed {first} on {threads} threads in {seconds:.1} s ({:.0} schedules/s)",
        schedules as f64 / seconds
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The handover wedge, by construction: a key parked past the gap bound, an orderly
/// handover, the key released. Fails on a core that starts nothing with a full gap.
#[test]
fn a_handover_with_a_full_gap_drains() {
    let p = Params {
        seed: 1,
        partitions: 1,
        records: 60,
        keys: 2,
        members: 2,
        fault_steps: 0,
        ordering: Ordering::Key,
        concurrency: 4,
        per_partition: 100,
        max_tracked_above: 5,
        batch: None,
        protocol: Protocol::Classic,
        dead_letter: false,
        world: world::World::default(),
        gaps: Gaps::Sparse,
        metadata_max_chars: crate::core::offsets::DEFAULT_METADATA_MAX_CHARS,
        metadata_faults: false,
    };
    let mut sim = Sim::new(p);
    for r in &mut sim.logs[0] {
        *r = LogRecord { key: 1, data: true };
    }
    sim.logs[0][0].key = 0;
    sim.index_logs();
    sim.rejected.clear();
    let _ = sim.parked.insert(0);
    // The first owner runs until its gap is full.
    for _ in 0..2_000 {
        sim.step += 1;
        sim.fetch(0);
        sim.complete(0);
        sim.commit_flow(0);
        sim.deliver_request();
        sim.process(0).unwrap();
    }
    let gap_full = sim.members[0]
        .core
        .partitions()
        .iter()
        .all(|p| p.tracker.gap_full());
    assert!(gap_full, "the gap filled behind the parked key");
    // Handed over while the key is parked; then the dispatcher recovers.
    sim.handover_to(0, 1);
    for _ in 0..2_000 {
        if sim.owner[0] == Some(1) {
            break;
        }
        sim.step += 1;
        sim.complete(0);
        sim.deliver_request();
        sim.process(0).unwrap();
    }
    assert_eq!(sim.owner[0], Some(1), "the revoke ended");
    sim.parked.clear();
    assert!(
        sim.committed[0].1.starts_with("tk3:id-0:0:"),
        "{:?}",
        sim.committed[0]
    );
    sim.faults = false;
    sim.p.fault_steps = sim.step as usize;
    let _ = sim.run().unwrap();
}

/// The repeat bound is not vacuous: kills do make the group offer accepted records again,
/// and each schedule stays within what its kills allow.
#[test]
fn kills_repeat_accepted_runs_only_within_the_bound() {
    let (mut repeats, mut bound) = (0, 0);
    for seed in 1..=300 {
        let (r, b) = Sim::new(Params::from_seed(seed))
            .run()
            .unwrap_or_else(|v| panic!("seed {seed}: {}", v.0));
        repeats += r;
        bound += b;
    }
    assert!(
        repeats > 0,
        "no schedule repeated anything: the check would be vacuous"
    );
    assert!(repeats <= bound);
    eprintln!(
        "simulation: 300 schedules repeated {repeats} accepted runs against a bound of {bound}"
    );
}

/// Each protocol's coordinator rules are reached: its refusals, and a static member's
/// commits applied after it died and its partitions taken back within its session. (Under
/// KIP-848 the strict check refuses a request sent before the member's epoch moved for
/// another partition.)
#[test]
fn every_protocol_reaches_its_refusals_and_membership_events() {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for seed in 1..=600 {
        let p = Params::from_seed(seed);
        let mut sim = Sim::new(p);
        let mut steps = 0;
        let limit = p.fault_steps as u64;
        while steps < limit {
            sim.step += 1;
            sim.expire_sessions();
            sim.one_step()
                .unwrap_or_else(|v| panic!("seed {seed}: {}", v.0));
            steps += 1;
        }
        for (event, n) in sim.seen {
            *seen
                .entry(format!("{}: {event}", protocol_kind(p.protocol)))
                .or_default() += n;
        }
    }
    eprintln!("simulation: coordinator events over 600 schedules: {seen:#?}");
    for want in [
        "Classic: ILLEGAL_GENERATION",
        "Classic: REBALANCE_IN_PROGRESS",
        "Classic: UNKNOWN_MEMBER_ID",
        "Static: ILLEGAL_GENERATION",
        "Static: FENCED_INSTANCE_ID",
        "Static: commit of a dead static member applied",
        "Static: static member back within its session",
        "Strict: STALE_MEMBER_EPOCH",
        "Strict: UNKNOWN_MEMBER_ID",
        // KIP-1251's relaxed check refuses only a commit of a partition the member no longer
        // holds at that epoch; the core never has one out (a revoke waits for its request).
        "Relaxed: UNKNOWN_MEMBER_ID",
        "Classic: dispatcher: retry after a 5xx or a 429",
        "Classic: dispatcher: refused, dead-lettered",
        "Classic: coordinator: a request applied before another member's earlier one",
        "Strict: coordinator: a request applied before another member's earlier one",
    ] {
        assert!(
            seen.get(want).is_some_and(|n| *n > 0),
            "never reached: {want}"
        );
    }
}

fn protocol_kind(p: Protocol) -> &'static str {
    match p {
        Protocol::Classic => "Classic",
        Protocol::Static { .. } => "Static",
        Protocol::Consumer { relaxed: false } => "Strict",
        Protocol::Consumer { relaxed: true } => "Relaxed",
    }
}

/// The byte budget, by construction: partition 0's key is parked with its records waiting
/// behind it, and they hold more than half the budget; partition 1's records, with keys of
/// their own, keep running while faults last. Fails on a partition set that pauses every
/// partition with waiting records while the budget is full (issue 34, defect 2).
#[test]
fn a_parked_partition_never_holds_the_budget_against_the_others() {
    let p = Params {
        seed: 7,
        partitions: 2,
        records: 120,
        keys: 4,
        members: 1,
        fault_steps: 3_000,
        ordering: Ordering::Key,
        concurrency: 4,
        per_partition: 100,
        max_tracked_above: 50,
        batch: None,
        protocol: Protocol::Classic,
        dead_letter: false,
        world: world::World {
            budget: Some(12),
            ..world::World::default()
        },
        gaps: Gaps::Sparse,
        metadata_max_chars: crate::core::offsets::DEFAULT_METADATA_MAX_CHARS,
        metadata_faults: false,
    };
    let mut sim = Sim::new(p);
    for r in &mut sim.logs[0] {
        *r = LogRecord { key: 0, data: true };
    }
    for (o, r) in sim.logs[1].iter_mut().enumerate() {
        *r = LogRecord {
            key: 1 + (o as u64 % 3),
            data: true,
        };
    }
    sim.index_logs();
    sim.rejected.clear();
    sim.parked.clear();
    let _ = sim.parked.insert(0);
    for _ in 0..3_000 {
        sim.step += 1;
        sim.fetch(0);
        sim.complete(0);
        sim.commit_flow(0);
        sim.deliver_request();
        sim.process(0).unwrap();
        sim.check().unwrap();
        sim.check_world().unwrap_or_else(|v| panic!("{}", v.0));
    }
    assert_eq!(
        sim.first_unaccepted[1], 120,
        "partition 1 drained while partition 0's key was parked"
    );
    assert!(
        sim.seen.contains_key(
            "world: a partition paused by the byte budget with no key of its own held"
        ) || sim.first_unaccepted[1] == 120
    );
    sim.parked.clear();
    sim.faults = false;
    sim.p.fault_steps = sim.step as usize;
    let _ = sim.run().unwrap();
}

/// The world's faults are reached (each at least once over 600 schedules), so the
/// invariants are checked against them: topics created again and found by their new id,
/// positions moved back, partitions' own commit refusals, runs ended without an outcome,
/// final commits withheld, partitions paused by the byte budget.
#[test]
fn the_worlds_faults_are_reached() {
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in 1..=600 {
        let mut sim = Sim::new(Params::from_seed(seed));
        while sim.step < sim.p.fault_steps as u64 {
            sim.step += 1;
            sim.expire_sessions();
            sim.one_step()
                .unwrap_or_else(|v| panic!("seed {seed}: {}", v.0));
            sim.check_world()
                .unwrap_or_else(|v| panic!("seed {seed}: {}", v.0));
        }
        for (event, n) in sim.seen {
            *seen.entry(event).or_default() += n;
        }
    }
    eprintln!("simulation: the world's events over 600 schedules: {seen:#?}");
    for want in [
        "world: a topic deleted and created again",
        "world: a new topic id found",
        "world: a position moved back",
        "world: a run ended without an outcome",
        "world: a final commit withheld",
        "world: a partition paused by the byte budget with no key of its own held",
        "UNKNOWN_TOPIC_OR_PARTITION",
    ] {
        assert!(
            seen.get(want).is_some_and(|n| *n > 0),
            "never reached: {want}"
        );
    }
}

/// The commit metadata's draws are reached: gaps dense enough, under a small budget, hold
/// runs above a gap at the budget, and new owners are handed every kind of metadata that is
/// not their group's last commit's.
#[test]
fn dense_gaps_fill_the_commit_metadata_and_new_owners_meet_foreign_metadata() {
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in 1..=600 {
        let p = Params::from_seed(seed);
        let mut sim = Sim::new(p);
        while sim.step < p.fault_steps as u64 {
            sim.step += 1;
            sim.expire_sessions();
            sim.one_step()
                .unwrap_or_else(|v| panic!("seed {seed}: {}", v.0));
        }
        for (event, n) in sim.seen {
            *seen.entry(event).or_default() += n;
        }
    }
    eprintln!("simulation: metadata events over 600 schedules: {seen:#?}");
    for want in [
        "metadata: runs held at the budget",
        "metadata: the tk1 form",
        "metadata: foreign",
        "metadata: cut short",
        "metadata: not UTF-8",
        "metadata: another form",
        "metadata: another offset",
        "metadata: too long",
        "metadata: the tk2 form",
        "metadata: an older topic's id",
        "metadata: a malformed topic id",
        "metadata: a commit of an older topic, read anew",
    ] {
        assert!(
            seen.get(want).is_some_and(|n| *n > 0),
            "never reached: {want}"
        );
    }
}
