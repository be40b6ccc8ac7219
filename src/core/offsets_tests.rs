use proptest::prelude::*;

use super::*;

/// The handled ranges a commit's metadata names.
fn named(offset: i64, metadata: &str) -> Vec<(i64, i64)> {
    offset_codec::decode(offset, metadata)
        .unwrap_or_else(|e| panic!("{metadata:?}: {e}"))
        .into_ranges()
}

#[test]
fn accepted_offsets_above_a_gap_survive_a_restart() {
    let mut t = OffsetTracker::default();
    for o in 10..20 {
        assert_eq!(t.received(o), Received::Dispatch);
    }
    for o in [11, 12, 13, 15, 19] {
        t.handled(o);
    }
    let (offset, metadata) = t.take_new_commit().unwrap();
    assert_eq!(offset, 10);
    assert!(metadata.starts_with("tk2:10:"), "{metadata}");
    assert_eq!(named(10, &metadata), vec![(11, 14), (15, 16), (19, 20)]);
    // The next owner reads the commit back.
    let mut next = OffsetTracker::from_committed(Some(offset), &metadata);
    assert_eq!(next.metadata_refused(), None);
    assert_eq!(next.take_new_commit(), None);
    let got: Vec<Received> = (10..20).map(|o| next.received(o)).collect();
    assert_eq!(
        got.iter()
            .filter(|r| **r == Received::AlreadyAccepted)
            .count(),
        5
    );
    assert_eq!(next.commit_offset(), Some(10));
    next.handled(10);
    let (offset, metadata) = next.take_new_commit().unwrap();
    assert_eq!(
        (offset, named(14, &metadata)),
        (14, vec![(15, 16), (19, 20)])
    );
    for o in [14, 16, 17, 18] {
        next.handled(o);
    }
    assert_eq!(next.take_new_commit(), Some((20, String::new())));
}

#[test]
fn a_map_of_the_first_form_is_read() {
    // The previous owner (an older version) handled 101-103 above a gap at 100.
    let mut t = OffsetTracker::from_committed(Some(100), "tk1:100:1-3");
    assert_eq!(t.received(100), Received::Dispatch);
    t.handled(100);
    assert_eq!(t.take_new_commit(), Some((104, String::new())));
    for o in 101..=103 {
        assert_eq!(t.received(o), Received::AlreadyAccepted, "offset {o}");
    }
    assert_eq!(t.received(104), Received::Dispatch);
}

#[test]
fn one_record_per_transaction_costs_the_map_nothing() {
    // Issue 34, defect 3: a parked record at offset 0, 4,000 records after it each followed
    // by its transaction's commit marker, all accepted. The markers are never returned; the
    // consumer's position passes them.
    let mut t = OffsetTracker::default();
    assert_eq!(t.received(0), Received::Dispatch);
    t.position(2);
    for i in 1..=4_000 {
        let o = 2 * i;
        assert_eq!(t.received(o), Received::Dispatch);
        t.position(o + 2);
        t.handled(o);
    }
    assert_eq!(t.gap_hold(1), None);
    let (offset, metadata) = t.take_new_commit().unwrap();
    assert_eq!(offset, 0);
    assert!(metadata.len() < 16, "{metadata}");
    assert_eq!(t.maps_cut(), 0);
    // The next owner runs the parked record and nothing else.
    let mut next = OffsetTracker::from_committed(Some(0), &metadata);
    assert_eq!(next.received(0), Received::Dispatch);
    for i in 1..=4_000 {
        assert_eq!(next.received(2 * i), Received::AlreadyAccepted, "{}", 2 * i);
    }
    next.handled(0);
    assert_eq!(next.take_new_commit(), Some((8_001, String::new())));
}

#[test]
fn compaction_gaps_cost_the_map_nothing() {
    // One record left every 100 offsets.
    let mut t = OffsetTracker::default();
    let _ = t.received(0);
    for i in 1..=9_000 {
        let _ = t.received(100 * i);
        t.handled(100 * i);
    }
    // Offsets never returned join the run before them.
    let (_, metadata) = t.take_new_commit().unwrap();
    assert_eq!(named(0, &metadata), vec![(100, 900_001)]);
    assert!(metadata.len() < 16, "{metadata}");
}

#[test]
fn records_waiting_behind_a_parked_key_are_left_out_of_the_map() {
    // Key a parked at 0; its later records (every third) wait; the others are handled.
    let mut t = OffsetTracker::default();
    for o in 0..30 {
        let _ = t.received(2 * o);
        if o % 3 != 0 {
            t.handled(2 * o);
        }
    }
    let (offset, metadata) = t.take_new_commit().unwrap();
    let map = offset_codec::decode(offset, &metadata).unwrap();
    for o in 0..30 {
        assert_eq!(map.contains(2 * o), o % 3 != 0, "{}", 2 * o);
    }
    // Nothing above the last handled record is described.
    assert_eq!(map.ranges().last().map(|r| r.1), Some(59));
}

#[test]
fn a_message_below_what_was_received_is_a_move_back_never_already_accepted() {
    let mut t = OffsetTracker::default();
    for o in 0..5 {
        assert_eq!(t.received(o), Received::Dispatch);
    }
    t.handled(0);
    t.handled(1);
    t.handled(3);
    let _ = t.take_new_commit();
    // The position moved back (a reset, a recreated topic, a truncated log): offsets
    // handled, outstanding or handled above the gap alike are no proof of anything.
    for o in [0, 1, 2, 3, 4] {
        assert_eq!(t.received(o), Received::MovedBack { expected: 5 }, "{o}");
    }
    assert_eq!(t.outstanding(), 2, "nothing recorded: 2 and 4");
    assert_eq!(t.received(5), Received::Dispatch);
}

#[test]
fn records_tracked_above_a_gap_are_bounded() {
    let mut t = OffsetTracker::default();
    let _ = t.received(0); // parked
    let mut o = 1;
    while !t.gap_full() {
        let _ = t.received(o);
        t.handled(o);
        o += 1;
    }
    assert_eq!(o as usize, MAX_TRACKED_ABOVE + 1);
    assert_eq!(t.gap_hold(1), Some(GapHold::Tracked));
    let (offset, metadata) = t.take_new_commit().unwrap();
    assert_eq!(offset, 0);
    assert_eq!(named(0, &metadata), vec![(1, MAX_TRACKED_ABOVE as i64 + 1)]);
    t.handled(0);
    assert!(!t.gap_full());
    assert_eq!(t.take_new_commit(), Some((o, String::new())));
}

#[test]
fn metadata_that_is_not_a_map_of_the_offset_is_not_read() {
    for (metadata, why) in [
        ("tk1:4:1", MetadataError::OtherOffset),
        ("something else", MetadataError::Foreign),
        ("tk2:5:x", MetadataError::Malformed("no runs")),
        ("tk2:5:r!", MetadataError::Malformed("not Base64")),
        ("tk9:5:AAAA", MetadataError::UnknownForm("tk9".into())),
        ("\u{FFFD}\u{FFFD}", MetadataError::Foreign),
    ] {
        let mut t = OffsetTracker::from_committed(Some(5), metadata);
        assert_eq!(t.metadata_refused(), Some(&why), "{metadata}");
        // Every record runs: at-least-once.
        assert_eq!(t.received(6), Received::Dispatch);
    }
    assert_eq!(
        parse_metadata(5, "tk1:5:2-4").iter().collect::<Vec<_>>(),
        vec![7, 8, 9]
    );
}

#[test]
fn a_new_owner_of_a_full_gap_runs_the_record_at_it_and_moves_past_the_map() {
    let mut t = OffsetTracker::from_committed(Some(0), &format!("tk1:0:1-{MAX_TRACKED_ABOVE}"));
    assert_eq!(t.gap_head(), None, "nothing received yet");
    assert_eq!(t.received(0), Received::Dispatch);
    assert_eq!(t.received(1), Received::AlreadyAccepted);
    assert_eq!(t.gap_head(), Some(0));
    // Its own map carries the previous owner's on.
    let (_, metadata) = t.take_new_commit().unwrap();
    assert_eq!(named(0, &metadata), vec![(1, MAX_TRACKED_ABOVE as i64 + 1)]);
    t.handled(0);
    assert_eq!(t.commit_offset(), Some(MAX_TRACKED_ABOVE as i64 + 1));
}

#[test]
fn a_small_budget_holds_runs_above_the_gap_before_the_map_outgrows_it() {
    // Budget for about two runs: a parked record at 0, then records each followed by a
    // marker, every other one of a parked key (waiting), the rest handled at once.
    let budget = 14;
    let mut t = OffsetTracker::new(TrackerLimits {
        max_above: 1_000,
        metadata_max_chars: budget,
    });
    let _ = t.received(0);
    let mut o = 2;
    let mut held_at = None;
    for i in 0..200 {
        let _ = t.received(o);
        t.position(o + 2);
        if i % 2 == 0 {
            if t.gap_hold(0).is_some() {
                held_at = Some(o);
                break;
            }
            t.started(1);
            t.handled(o);
        }
        let (_, metadata) = t.commit().unwrap();
        assert!(metadata.len() <= budget, "{metadata}");
        o += 2;
    }
    let held_at = held_at.expect("the gate held");
    assert_eq!(t.gap_hold(0), Some(GapHold::Metadata));
    assert_eq!(t.maps_cut(), 0);
    // The record at the gap still may start; handling it frees the gate.
    assert_eq!(t.gap_head(), Some(0));
    t.handled(0);
    assert!(t.commit_offset().unwrap() > 0);
    assert!(held_at > 2);
}

#[test]
fn commit_offset_stops_at_the_first_gap() {
    let mut t = OffsetTracker::default();
    assert_eq!(t.commit_offset(), None);
    for o in 10..15 {
        let _ = t.received(o);
    }
    assert_eq!(t.commit_offset(), Some(10));
    t.handled(11);
    t.handled(12);
    let (offset, metadata) = t.take_new_commit().unwrap();
    assert_eq!((offset, named(10, &metadata)), (10, vec![(11, 13)]));
    assert_eq!(t.take_new_commit(), None);
    t.handled(10);
    assert_eq!(t.take_new_commit(), Some((13, String::new())));
    t.handled(14);
    assert_eq!(t.commit_offset(), Some(13));
    t.handled(13);
    assert_eq!(t.take_new_commit(), Some((15, String::new())));
    assert_eq!(t.outstanding(), 0);
}

#[test]
fn position_moves_past_control_records_only_when_nothing_is_outstanding() {
    let mut t = OffsetTracker::default();
    let _ = t.received(0);
    let _ = t.received(1);
    t.position(3); // commit marker at 2
    assert_eq!(t.commit_offset(), Some(0));
    t.handled(0);
    t.handled(1);
    assert_eq!(t.commit_offset(), Some(3));
    t.position(-1001); // invalid positions are ignored
    t.position(2); // never goes back
    assert_eq!(t.commit_offset(), Some(3));
}

#[test]
fn never_commits_past_an_outstanding_offset_in_any_order() {
    // Every order of handling 5 messages: the commit offset never passes an outstanding one.
    let offsets = [0i64, 1, 2, 3, 4];
    let mut perms: Vec<Vec<i64>> = vec![vec![]];
    for _ in 0..offsets.len() {
        let mut next = Vec::new();
        for p in &perms {
            for o in offsets.iter().filter(|o| !p.contains(o)) {
                let mut q = p.clone();
                q.push(*o);
                next.push(q);
            }
        }
        perms = next;
    }
    assert_eq!(perms.len(), 120);
    for order in perms {
        let mut t = OffsetTracker::default();
        offsets.iter().for_each(|o| {
            let _ = t.received(*o);
        });
        let mut done = BTreeSet::new();
        for o in order {
            t.handled(o);
            let _ = done.insert(o);
            let c = t.commit_offset().unwrap();
            assert!((0..c).all(|x| done.contains(&x)));
        }
        assert_eq!(t.commit_offset(), Some(5));
    }
}

/// One step of a partition's life, as the partition set drives its tracker.
#[derive(Debug, Clone)]
enum Step {
    /// The next record arrives after `gap` offsets the consumer never returns.
    Receive { gap: u8 },
    /// A waiting record starts, if the gate lets it (the record at the gap always may).
    Start { pick: u16 },
    /// A run ends, its record handled or not (it waits to start again).
    Finish { pick: u16, handled: bool },
    /// A commit request goes out.
    Commit,
    /// A handover: the next owner takes the last commit.
    Handover,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (prop_oneof![Just(0u8), Just(1), 0u8..20]).prop_map(|gap| Step::Receive { gap }),
        6 => any::<u16>().prop_map(|pick| Step::Start { pick }),
        4 => (any::<u16>(), prop::bool::weighted(0.8)).prop_map(|(pick, handled)| Step::Finish { pick, handled }),
        2 => Just(Step::Commit),
        1 => Just(Step::Handover),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the gaps, the order runs finish in and the budget: no commit's metadata is
    /// over the budget or cut, it names every record handled above its offset and no record
    /// that is not, and a next owner that takes it over dispatches exactly the records not
    /// handled.
    #[test]
    fn every_map_fits_and_is_exact(
        budget in prop_oneof![0usize..12, 12usize..80, Just(4096)],
        max_above in prop_oneof![1usize..5, Just(1000)],
        steps in prop::collection::vec(step(), 1..1000),
        id in prop_oneof![Just(None), Just(Some("id-7")), Just(Some("EjRWeJq83vD__________w"))],
    ) {
        let limits = TrackerLimits { max_above, metadata_max_chars: budget };
        let id: Option<Arc<str>> = id.map(Arc::from);
        let mut t = OffsetTracker::new(limits);
        t.set_topic_id(id.clone());
        let mut next_offset = 0i64;
        let mut waiting: Vec<i64> = Vec::new();
        let mut in_flight: Vec<i64> = Vec::new();
        let mut handled: BTreeSet<i64> = BTreeSet::new();
        let mut records: BTreeSet<i64> = BTreeSet::new();
        let mut committed: Option<(i64, String)> = None;
        for s in steps {
            match s {
                Step::Receive { gap } => {
                    let o = next_offset + i64::from(gap);
                    prop_assert_eq!(t.received(o), Received::Dispatch);
                    t.position(o + 1);
                    records.insert(o);
                    waiting.push(o);
                    next_offset = o + 1;
                }
                Step::Start { pick } if !waiting.is_empty() => {
                    let i = usize::from(pick) % waiting.len();
                    let o = waiting[i];
                    let hold = t.gap_hold(in_flight.len());
                    if hold.is_none() {
                        t.started(1);
                    } else if t.gap_head() != Some(o) {
                        continue;
                    }
                    waiting.swap_remove(i);
                    in_flight.push(o);
                }
                Step::Finish { pick, handled: ok } if !in_flight.is_empty() => {
                    let o = in_flight.swap_remove(usize::from(pick) % in_flight.len());
                    if ok {
                        t.handled(o);
                        handled.insert(o);
                    } else {
                        waiting.push(o);
                    }
                }
                Step::Commit | Step::Handover => {
                    if let Some((offset, metadata)) = t.take_new_commit() {
                        committed = Some((offset, metadata));
                    }
                    let Some((offset, metadata)) = committed.clone() else { continue };
                    prop_assert!(metadata.len() <= budget, "{} > {}", metadata.len(), budget);
                    prop_assert_eq!(t.maps_cut(), 0);
                    // The id is named whenever the text naming it fits (the gate counts it).
                    let named_id = offset_codec::decode_committed(offset, &metadata)
                        .unwrap()
                        .topic_id
                        .map(str::to_owned);
                    let header = id.as_ref().map_or(usize::MAX, |i| {
                        "tk3:".len() + i.len() + 2 + offset.to_string().len()
                    });
                    if header <= budget {
                        prop_assert_eq!(named_id.as_deref(), id.as_deref(), "{}", metadata);
                    } else {
                        prop_assert_eq!(named_id, None);
                    }
                    let map = parse_metadata(offset, &metadata);
                    for &r in records.range(..offset) {
                        prop_assert!(handled.contains(&r), "{} committed, not handled", r);
                    }
                    for &r in records.range(offset..) {
                        prop_assert_eq!(map.contains(r), handled.contains(&r), "record {}", r);
                    }
                    if matches!(s, Step::Handover) {
                        // Runs in flight are abandoned; the next owner reads everything again.
                        let mut next = OffsetTracker::from_committed_with(Some(offset), &metadata, limits);
                        next.set_topic_id(id.clone());
                        prop_assert!(!next.committed_under_other_topic(id.as_deref()));
                        waiting.clear();
                        in_flight.clear();
                        for &r in records.range(offset..) {
                            let got = next.received(r);
                            prop_assert_eq!(got == Received::Dispatch, !handled.contains(&r), "record {}", r);
                            if got == Received::Dispatch {
                                waiting.push(r);
                            }
                        }
                        next.position(next_offset);
                        t = next;
                    }
                }
                _ => {}
            }
        }
    }
}

#[test]
fn commits_name_the_topic_id_and_a_new_owner_tells_an_older_topics_commit() {
    let mut t = OffsetTracker::from_committed(Some(10), "");
    assert_eq!(t.committed_topic_id(), None);
    // No id known: `tk2`, as before (and nothing for an empty map).
    let _ = t.received(10);
    let _ = t.received(11);
    t.handled(11);
    assert_eq!(t.take_new_commit(), Some((10, "tk2:10:bAQ".to_owned())));
    // The id becomes known: the same commit offset goes out again, naming it.
    t.set_topic_id(Some(Arc::from("new-id")));
    assert_eq!(
        t.take_new_commit(),
        Some((10, "tk3:new-id:10:bAQ".to_owned()))
    );
    assert_eq!(t.take_new_commit(), None);
    t.handled(10);
    // An empty map names the id too.
    assert_eq!(t.take_new_commit(), Some((12, "tk3:new-id:12:".to_owned())));

    // A new owner reads the id its commit was made under.
    let next = OffsetTracker::from_committed(Some(12), "tk3:new-id:12:");
    assert_eq!(next.committed_topic_id().map(|i| &**i), Some("new-id"));
    assert!(!next.committed_under_other_topic(Some("new-id")));
    assert!(next.committed_under_other_topic(Some("newer-id")));
    // Unknown now: nothing to compare.
    assert!(!next.committed_under_other_topic(None));
    // The older forms, foreign or malformed text, name no id.
    for idless in [
        "",
        "tk2:12:bAQ",
        "tk1:12:1",
        "AgAAAYvHN2Nf",
        "tk3:a b:12:",
        "tk3:x:13:",
    ] {
        let t = OffsetTracker::from_committed(Some(12), idless);
        assert_eq!(t.committed_topic_id(), None, "{idless}");
        assert!(!t.committed_under_other_topic(Some("newer-id")), "{idless}");
    }
    assert!(matches!(
        OffsetTracker::from_committed(Some(12), "tk3:a b:12:").metadata_refused(),
        Some(MetadataError::Malformed(_))
    ));
}

#[test]
fn the_map_gate_holds_at_the_last_offset() {
    // Found by the commit_metadata fuzz target in CI: a record at i64::MAX overflowed the
    // start gate's span.
    let mut t = OffsetTracker::from_committed(Some(i64::MAX), "");
    let _ = t.received(i64::MAX);
    let _ = t.map_fits(1, 1);
    t.handled(i64::MAX);
    let _ = t.take_new_commit();
    crate::fuzz::commit_metadata(i64::MAX, "");
}
