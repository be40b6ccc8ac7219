//! Unit tests of `partitions`.
use super::*;
use crate::core::batch::BatchLimits;
use crate::core::starts::MESSAGE_OVERHEAD;
use crate::core::testing::{record, TestRecord, TestShell, TestTrigger};

fn tp(p: i32) -> TopicPartition {
    TopicPartition {
        topic: "t".into(),
        partition: p,
    }
}

fn msg(p: i32, offset: i64, key: &str) -> TestRecord {
    record(p, offset, key.as_bytes(), 36)
}

fn trigger(permits: usize, ordering: Ordering) -> TriggerSlot<TestShell> {
    TriggerSlot {
        index: 0,
        ordering,
        runtime: TestTrigger::new(permits),
        batch: None,
    }
}

fn signals(s: &mut PartitionSet<TestShell>) -> Vec<RunSignal> {
    let mut out = Vec::new();
    s.take_signals(|x| out.push(x));
    out
}

fn assigned(p: i32, committed: Option<i64>, metadata: &str) -> AssignedPartition {
    AssignedPartition {
        tp: tp(p),
        committed,
        metadata: metadata.into(),
        topic_id: None,
    }
}

fn set(per_partition: usize, max_bytes: usize) -> PartitionSet<TestShell> {
    PartitionSet::new(Limits {
        per_partition,
        max_bytes,
        max_tracked_above: crate::core::offsets::MAX_TRACKED_ABOVE,
        metadata_max_chars: crate::core::offsets::DEFAULT_METADATA_MAX_CHARS,
    })
}

fn commits(s: &mut PartitionSet<TestShell>) -> Vec<(i32, i64, String)> {
    let mut out = Vec::new();
    s.take_commits(Instant::now(), |tp, o, m| out.push((tp.partition, o, m)));
    out
}

fn process(s: &mut PartitionSet<TestShell>) -> Actions<TestShell> {
    let mut out = Actions::default();
    s.process(Instant::now(), &mut out);
    out
}

fn finish(s: &mut PartitionSet<TestShell>, start: Start<TestShell>, handled: bool) {
    let offset = start.msg.offset();
    drop(start.permit);
    let _ = s.on_run_finished(start.id, start.generation, &start.key, &[(offset, handled)]);
}

#[test]
fn an_offset_is_committed_only_once_its_run_and_every_earlier_one_is_handled() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(8, Ordering::Key),
        Instant::now(),
    );
    for o in 0..3 {
        assert!(matches!(
            s.on_message(msg(0, o, &format!("k{o}"))),
            Arrival::Queued(_)
        ));
    }
    let mut starts = process(&mut s).starts;
    assert_eq!(starts.len(), 3);
    assert!(
        commits(&mut s).is_empty(),
        "nothing handled, nothing to commit"
    );
    let third = starts.pop().unwrap();
    let second = starts.pop().unwrap();
    let first = starts.pop().unwrap();
    finish(&mut s, third, true);
    // Offset 2 is handled above the gap at 0: the commit stays at 0 and names 2.
    let c = commits(&mut s);
    assert_eq!((c.len(), c[0].0, c[0].1), (1, 0, 0));
    assert_eq!(named(0, &c[0].2), vec![2]);
    finish(&mut s, second, false);
    assert!(commits(&mut s).is_empty(), "an abandoned run moves nothing");
    finish(&mut s, first, true);
    let c = commits(&mut s);
    assert_eq!((c.len(), c[0].0, c[0].1), (1, 0, 1));
    assert_eq!(named(1, &c[0].2), vec![2]);
    assert!(!s.commits_pending());
}

#[test]
fn metadata_is_encoded_once_per_take_however_many_runs_were_handled() {
    let mut s = set(10_000, 1 << 30);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(10_000, Ordering::Unordered),
        Instant::now(),
    );
    for o in 0..1000 {
        let _ = s.on_message(msg(0, o, "k"));
    }
    let starts = process(&mut s).starts;
    for st in starts.into_iter().skip(1) {
        finish(&mut s, st, true);
    }
    // 999 handled above the gap at 0, one take: one commit.
    let c = commits(&mut s);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, 0);
}

#[test]
fn a_revoked_partition_drops_its_waiting_messages_and_a_new_assignment_starts_afresh() {
    let mut s = set(2, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(1, Ordering::Key),
        Instant::now(),
    );
    for o in 0..4 {
        let _ = s.on_message(msg(0, o, "same"));
    }
    let out = process(&mut s);
    assert_eq!(out.starts.len(), 1);
    assert_eq!(out.pause, vec![tp(0)], "3 waiting ≥ 2: paused");
    assert!(s.buffered_bytes() > 0);
    let in_flight = out.starts.into_iter().next().unwrap();
    s.begin_revoke(&[tp(0)], false);
    assert_eq!(s.buffered_bytes(), 0);
    let a = in_flight.assignment();
    assert_eq!(
        signals(&mut s),
        vec![RunSignal::Drain(a)],
        "a revoke stops retries and lets the attempt finish"
    );
    assert_eq!(s.in_flight_of(&[tp(0)]), 1);
    assert!(process(&mut s).starts.is_empty());
    finish(&mut s, in_flight.clone_for_test(), true);
    assert_eq!(s.in_flight_of(&[tp(0)]), 0);
    assert_eq!(s.final_commit(&tp(0)), Some((1, String::new())));
    assert!(s.remove(&tp(0)));
    assert_eq!(signals(&mut s), vec![RunSignal::Abandon(a)]);
    // Assigned back: unpaused, nothing queued, a new generation.
    s.assign(
        assigned(0, Some(1), ""),
        trigger(1, Ordering::Key),
        Instant::now(),
    );
    let p = s.by_tp(&tp(0)).unwrap();
    assert!(p.paused.is_none());
    assert_ne!(p.generation, in_flight.generation);
    assert_eq!(p.backlog(), 0);
    // A completion of the earlier assignment changes nothing.
    assert_eq!(
        s.on_run_finished(
            in_flight.id,
            in_flight.generation,
            &in_flight.key,
            &[(1, true)]
        ),
        None
    );
    assert!(!s.commits_pending());
    assert!(matches!(
        s.on_message(msg(0, 1, "same")),
        Arrival::Queued(_)
    ));
    assert_eq!(process(&mut s).starts.len(), 1);
}

#[test]
fn a_lost_partition_abandons_its_attempts_at_once() {
    let mut s = set(10, 1 << 20);
    s.assign(
        assigned(0, None, ""),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    let _ = s.on_message(msg(0, 5, "a"));
    let st = process(&mut s).starts.pop().unwrap();
    s.begin_revoke(&[tp(0)], true);
    let a = st.assignment();
    assert_eq!(
        signals(&mut s),
        vec![RunSignal::Drain(a), RunSignal::Abandon(a)]
    );
}

#[test]
fn a_full_partition_pauses_and_resumes_at_half() {
    let mut s = set(4, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(1, Ordering::Partition),
        Instant::now(),
    );
    for o in 0..6 {
        let _ = s.on_message(msg(0, o, "k"));
    }
    let out = process(&mut s);
    assert_eq!(out.pause, vec![tp(0)]);
    assert!(s.by_tp(&tp(0)).unwrap().paused.is_some());
    let mut run = out.starts.into_iter().next().unwrap();
    // 5 waiting, then 4, 3, 2: resumed when 2 (half of 4) are left.
    for left in [4, 3, 2] {
        finish(&mut s, run, true);
        let out = process(&mut s);
        assert_eq!(s.by_tp(&tp(0)).unwrap().queue.waiting(), left);
        assert_eq!(out.resume.is_empty(), left > 2, "waiting {left}");
        run = out.starts.into_iter().next().unwrap();
    }
    assert_eq!(s.paused_count(), 0);
}

#[test]
fn the_byte_budget_pauses_every_partition_with_waiting_messages() {
    // Room for 6 messages, pressed from 3 on; a fair share of 3 each.
    let each = msg_bytes(&msg(0, 0, "a"));
    let mut s = set(100, 6 * each);
    for p in 0..2 {
        s.assign(
            assigned(p, Some(0), ""),
            trigger(0, Ordering::Key),
            Instant::now(),
        );
    }
    let _ = s.on_message(msg(0, 0, "a"));
    let _ = s.on_message(msg(0, 1, "a"));
    assert!(process(&mut s).pause.is_empty());
    let _ = s.on_message(msg(1, 0, "a"));
    let _ = s.on_message(msg(1, 1, "a"));
    let out = process(&mut s);
    let mut paused = out.pause.clone();
    paused.sort_by_key(|t| t.partition);
    assert_eq!(paused, vec![tp(0), tp(1)]);
    // Dropping partition 1's messages leaves two, not down to a quarter of the budget.
    s.begin_revoke(&[tp(1)], false);
    assert!(process(&mut s).resume.is_empty());
    let _ = s.remove(&tp(1));
    s.begin_revoke(&[tp(0)], false);
    let _ = s.remove(&tp(0));
    assert_eq!(s.buffered_bytes(), 0);
}

/// Whatever arrives, the connection holds at most its byte budget, plus what arrives for a
/// partition between its pause decision and the next round: each partition receives in
/// bursts (a fetch's worth), rounds decide after each burst.
#[test]
fn the_connection_holds_at_most_its_byte_budget_under_any_arrival_order() {
    let each = msg_bytes(&msg(0, 0, "a"));
    let budget = 64 * each;
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for _ in 0..200 {
        let partitions = 1 + next(8) as i32;
        let mut s = set(1000, budget);
        for p in 0..partitions {
            s.assign(
                assigned(p, Some(0), ""),
                trigger(0, Ordering::Key),
                Instant::now(),
            );
        }
        let mut offsets = vec![0i64; partitions as usize];
        let mut paused = vec![false; partitions as usize];
        for _ in 0..400 {
            let p = next(partitions as u64) as i32;
            if paused[p as usize] {
                continue;
            }
            // One record per arrival and a round after each: what reaches the core after a
            // pause is the shell's to bound.
            let o = offsets[p as usize];
            offsets[p as usize] += 1;
            let _ = s.on_message(msg(p, o, "a"));
            let out = process(&mut s);
            for t in out.pause {
                paused[t.partition as usize] = true;
            }
            for t in out.resume {
                paused[t.partition as usize] = false;
            }
            assert!(
                s.buffered_bytes() <= budget + each,
                "{} bytes held over a budget of {budget}",
                s.buffered_bytes()
            );
        }
    }
}

#[test]
fn a_partition_parked_on_a_key_holds_the_budget_alone_and_the_others_keep_flowing() {
    // Room for 8 messages over 2 partitions: a fair share of 4 each.
    let each = msg_bytes(&msg(0, 0, "a"));
    let mut s = set(100, 8 * each);
    for p in 0..2 {
        s.assign(
            assigned(p, Some(0), ""),
            trigger(10, Ordering::Key),
            Instant::now(),
        );
    }
    // Partition 0: key "a" parked at offset 0, eight more of it waiting behind.
    for o in 0..9 {
        let _ = s.on_message(msg(0, o, "a"));
    }
    let out = process(&mut s);
    assert_eq!(out.starts.len(), 1);
    assert_eq!(out.pause, vec![tp(0)]);
    let parked = s.by_tp(&tp(0)).unwrap();
    assert_eq!(parked.paused, Some(PauseReason::Budget));
    // Partition 1 runs key "b" while the budget stays full: below half its share, it flows.
    let _ = s.on_message(msg(1, 0, "b"));
    let _ = s.on_message(msg(1, 1, "b"));
    let mut out = process(&mut s);
    assert!(out.pause.is_empty(), "partition 1 keeps flowing");
    let run = out.starts.pop().unwrap();
    // A burst above half its share pauses it too, and draining to a quarter resumes it.
    for o in 2..5 {
        let _ = s.on_message(msg(1, o, "b"));
    }
    assert_eq!(process(&mut s).pause, vec![tp(1)]);
    assert_eq!(s.by_tp(&tp(1)).unwrap().paused, Some(PauseReason::Budget));
    let mut run = run;
    for _ in 0..3 {
        finish(&mut s, run, true);
        let mut out = process(&mut s);
        run = out.starts.pop().expect("the next record of key b starts");
        if !out.resume.is_empty() {
            assert_eq!(out.resume, vec![tp(1)]);
            break;
        }
    }
    assert!(s.by_tp(&tp(1)).unwrap().paused.is_none(), "resumed");
    assert_eq!(s.by_tp(&tp(0)).unwrap().paused, Some(PauseReason::Budget));
}

#[test]
fn a_partition_starved_of_permits_starts_when_another_partition_frees_one() {
    let mut s = set(100, 1 << 20);
    let t = trigger(1, Ordering::Key);
    s.assign(assigned(0, Some(0), ""), t.clone(), Instant::now());
    s.assign(assigned(1, Some(0), ""), t, Instant::now());
    let _ = s.on_message(msg(0, 0, "a"));
    let first = process(&mut s).starts.pop().unwrap();
    let _ = s.on_message(msg(1, 0, "b"));
    assert!(process(&mut s).starts.is_empty(), "no permit");
    finish(&mut s, first, true);
    let starts = process(&mut s).starts;
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].msg.partition(), 1);
}

#[test]
fn nothing_starts_while_holding_and_everything_may_start_after() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    s.set_holding(true);
    let _ = s.on_message(msg(0, 0, "a"));
    assert!(process(&mut s).starts.is_empty());
    s.set_holding(false);
    assert_eq!(process(&mut s).starts.len(), 1);
}

#[test]
fn an_already_accepted_message_is_not_queued_and_a_move_back_starts_the_partition_afresh() {
    let mut s = set(100, 1 << 20);
    // The previous owner handled 11 above its commit at 10.
    s.assign(
        assigned(0, Some(10), "tk1:10:1"),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    assert!(matches!(s.on_message(msg(0, 10, "a")), Arrival::Queued(_)));
    assert!(matches!(
        s.on_message(msg(0, 11, "b")),
        Arrival::AlreadyAccepted(_)
    ));
    assert!(matches!(
        s.on_message(msg(7, 0, "a")),
        Arrival::NotAssigned(_)
    ));
    // The position moves back to 10: nothing proves that 10 and 11 of the log read now
    // were handled. The partition starts again from 10; the waiting 10 is dropped.
    assert!(matches!(
        s.on_message(msg(0, 10, "a")),
        Arrival::MovedBack {
            expected: 12,
            offset: 10,
            ..
        }
    ));
    assert_eq!(s.buffered_bytes(), msg_bytes(&msg(0, 10, "a")));
    // Nothing runs until the shell identified the log read now (its topic's id).
    assert!(process(&mut s).starts.is_empty());
    assert_eq!(s.unverified().collect::<Vec<_>>(), vec![&tp(0)]);
    assert!(!s.verify_topic_id(&tp(0), Some("id-1".into())));
    assert_eq!(s.by_tp(&tp(0)).unwrap().topic_id.as_deref(), Some("id-1"));
    let st = process(&mut s).starts;
    assert_eq!(st.len(), 1);
    for x in st {
        finish(&mut s, x, true);
    }
    // The commit names the topic's id, now known.
    assert_eq!(commits(&mut s), vec![(0, 11, "tk3:id-1:11:".to_owned())]);
    assert!(matches!(s.on_message(msg(0, 11, "b")), Arrival::Queued(_)));
    // Another id for the topic now: it was created again, and the partition restarts.
    assert!(!s.verify_topic_id(&tp(0), Some("id-1".into())));
    assert!(s.verify_topic_id(&tp(0), Some("id-2".into())));
    let p = s.by_tp(&tp(0)).unwrap();
    assert_eq!((p.topic_id.as_deref(), p.backlog()), (Some("id-2"), 0));
    // What arrives before the consumer moved to the new log's start was read before the
    // move: dropped (read again from there), and its positions are not trusted.
    assert!(matches!(
        s.on_message(msg(0, 12, "c")),
        Arrival::BeforeSeek(_)
    ));
    s.on_position(&tp(0), Some(13));
    assert!(process(&mut s).starts.is_empty());
    assert!(commits(&mut s).is_empty());
    // Moved: the new log's records run from its start.
    s.on_sought(&tp(0));
    s.on_position(&tp(0), None);
    assert!(matches!(s.on_message(msg(0, 0, "a")), Arrival::Queued(_)));
    let st = process(&mut s).starts;
    assert_eq!(st.len(), 1);
    for x in st {
        finish(&mut s, x, true);
    }
    assert_eq!(commits(&mut s), vec![(0, 1, "tk3:id-2:1:".to_owned())]);
}

#[test]
fn a_position_left_from_an_earlier_assignment_is_not_trusted() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(10), ""),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    // A position ahead of the commit before any message or reset: ignored.
    s.on_position(&tp(0), Some(50));
    assert!(commits(&mut s).is_empty());
    // No position (fetch restarting from the commit), then one past two aborted records.
    s.on_position(&tp(0), None);
    s.on_position(&tp(0), Some(13));
    assert_eq!(commits(&mut s), vec![(0, 13, String::new())]);
}

#[test]
fn a_position_behind_what_was_read_with_no_message_starts_the_partition_afresh() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    s.on_position(&tp(0), None);
    assert!(matches!(s.on_message(msg(0, 2, "a")), Arrival::Queued(_)));
    for x in process(&mut s).starts {
        finish(&mut s, x, true);
    }
    s.on_position(&tp(0), Some(3));
    assert_eq!(commits(&mut s), vec![(0, 3, String::new())]);
    // The log was cut to one transaction marker; the consumer went back to its beginning
    // and read the marker: the position is 1, no message came. The partition starts again
    // from there and, once its log is identified, commits 1: a new owner starting at the
    // old 3 would skip the records written at 1 and 2.
    assert_eq!(s.on_position(&tp(0), Some(3)), None);
    let moved = s.on_position(&tp(0), Some(1)).expect("moved back");
    assert_eq!((moved.expected, moved.offset), (3, 1));
    assert_eq!(s.unverified().collect::<Vec<_>>(), vec![&tp(0)]);
    assert!(commits(&mut s).is_empty());
    assert!(!s.verify_topic_id(&tp(0), Some("id-1".into())));
    assert_eq!(commits(&mut s), vec![(0, 1, "tk3:id-1:1:".to_owned())]);
    // And the log goes on from there.
    assert!(matches!(s.on_message(msg(0, 1, "b")), Arrival::Queued(_)));
}

#[test]
fn a_paused_partitions_log_end_below_what_it_read_starts_it_afresh_from_its_commit() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(8, Ordering::Key),
        Instant::now(),
    );
    s.on_position(&tp(0), None);
    for (o, k) in [(0, "held"), (1, "a"), (2, "b"), (3, "c")] {
        let _ = s.on_message(msg(0, o, k));
    }
    let mut starts = process(&mut s).starts.into_iter();
    let _held = starts.next().unwrap();
    for st in starts {
        finish(&mut s, st, true);
    }
    let generation = s.by_tp(&tp(0)).unwrap().generation;
    // An end at or past what was read, or of another assignment, changes nothing.
    assert_eq!(s.on_log_end(&tp(0), generation, 4), None);
    assert_eq!(s.on_log_end(&tp(0), generation + 1, 2), None);
    assert_eq!(s.on_log_end(&tp(0), generation, -1), None, "no offset");
    // The log was cut to 2 while the partition was paused: offset 0 never ran, 1 did. The
    // bookkeeping starts again from the commit offset, 0 (not the end: record 0 would be
    // passed over), and what arrives before the consumer moved there is dropped.
    let moved = s.on_log_end(&tp(0), generation, 2).expect("moved back");
    assert_eq!((moved.expected, moved.offset), (4, 0));
    assert!(matches!(
        s.on_message(msg(0, 4, "d")),
        Arrival::BeforeSeek(_)
    ));
    s.on_sought(&tp(0));
    assert!(!s.verify_topic_id(&tp(0), Some("id-1".into())));
    assert_eq!(commits(&mut s), vec![(0, 0, "tk3:id-1:0:".to_owned())]);
    assert!(matches!(
        s.on_message(msg(0, 0, "held")),
        Arrival::Queued(_)
    ));
}

#[test]
fn only_the_commit_offset_moving_is_progress() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        trigger(8, Ordering::Key),
        Instant::now(),
    );
    for (o, k) in [(0, "held"), (1, "a"), (2, "b")] {
        let _ = s.on_message(msg(0, o, k));
    }
    let mut starts = process(&mut s).starts.into_iter();
    let held = starts.next().unwrap();
    let assigned_at = s.by_tp(&tp(0)).unwrap().last_progress;
    // Later keys are handled: the commit's metadata changes, its offset stays at 0.
    let later = Instant::now() + std::time::Duration::from_secs(5);
    for st in starts {
        finish(&mut s, st, true);
    }
    let mut taken = Vec::new();
    s.take_commits(later, |_, o, m| taken.push((o, m)));
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].0, named(0, &taken[0].1)), (0, vec![1, 2]));
    assert_eq!(
        s.by_tp(&tp(0)).unwrap().last_progress,
        assigned_at,
        "no progress"
    );
    finish(&mut s, held, true);
    s.take_commits(later, |_, _, _| {});
    assert_eq!(
        s.by_tp(&tp(0)).unwrap().last_progress,
        later,
        "the offset moved"
    );
}

#[test]
fn a_partition_with_a_full_gap_pauses_and_starts_nothing() {
    let mut s = set(1_000_000, 1 << 40);
    let n = crate::core::offsets::MAX_TRACKED_ABOVE as i64 + 2;
    s.assign(
        assigned(0, Some(0), ""),
        trigger(1 << 20, Ordering::Unordered),
        Instant::now(),
    );
    for o in 0..n {
        let _ = s.on_message(msg(0, o, "k"));
    }
    // Offset 0 stays in flight; everything above it is handled (a partition has at most
    // the gap bound of runs started at once, so in rounds).
    let mut parked = None;
    loop {
        let out = process(&mut s);
        if out.starts.is_empty() {
            break;
        }
        for st in out.starts {
            if st.msg.offset() == 0 {
                parked = Some(st);
            } else {
                finish(&mut s, st, true);
            }
        }
    }
    let parked = parked.expect("offset 0 started");
    assert!(s.by_tp(&tp(0)).unwrap().tracker.gap_full());
    let _ = s.on_message(msg(0, n, "k"));
    let out = process(&mut s);
    assert!(out.starts.is_empty(), "gap full: nothing new starts");
    assert!(s.by_tp(&tp(0)).unwrap().paused.is_some());
    finish(&mut s, parked, true);
    let out = process(&mut s);
    assert_eq!(out.resume, vec![tp(0)]);
    assert_eq!(out.starts.len(), 1);
}

/// The handover wedge: a new owner loads a full gap from the previous owner's commit
/// metadata, so the gap is full before anything started. The record at the gap must
/// start (and nothing else of a single-record trigger until the gap closes), whatever
/// the ordering or trigger kind, and the partition then drains.
#[test]
fn a_new_owner_of_a_full_gap_starts_the_record_at_the_gap_and_drains() {
    let max = crate::core::offsets::MAX_TRACKED_ABOVE as i64;
    let metadata = format!("tk1:0:1-{max}");
    let slots = [
        trigger(8, Ordering::Key),
        trigger(8, Ordering::Partition),
        trigger(8, Ordering::Unordered),
        batch_trigger(8, 3, 1 << 20),
    ];
    for slot in slots {
        let batch = slot.batch.is_some();
        let mut s = set(100, 1 << 20);
        s.assign(assigned(0, Some(0), &metadata), slot, Instant::now());
        // The consumer reads from the committed offset 0: the record at the gap, then
        // records the metadata lists as handled, then new ones.
        for o in 0..max + 4 {
            let _ = s.on_message(msg(0, o, if o == 0 { "parked" } else { "other" }));
        }
        let mut started = Vec::new();
        let mut paused = false;
        let mut resumed = false;
        // Later rounds run past any batch's max_wait.
        let mut now = Instant::now();
        for round in 0..10 {
            let mut out = Actions::default();
            s.process(now, &mut out);
            now += std::time::Duration::from_secs(2);
            paused |= out.pause.contains(&tp(0));
            resumed |= out.resume.contains(&tp(0));
            if round == 0 {
                assert_eq!(out.starts.len(), 1, "one run starts at the gap");
                assert_eq!(offsets_of(&out.starts[0])[0], 0);
                if !batch {
                    assert!(out.starts[0].batch.is_empty());
                }
            }
            for st in out.starts {
                let offsets = offsets_of(&st);
                started.extend(offsets.iter().copied());
                drop(st.permit);
                if batch {
                    let done: Vec<(i64, bool)> = offsets.iter().map(|o| (*o, true)).collect();
                    let _ = s.on_run_finished(st.id, st.generation, &None, &done);
                } else {
                    let _ = s.on_run_finished(st.id, st.generation, &st.key, &[(offsets[0], true)]);
                }
            }
        }
        started.sort_unstable();
        assert!(
            paused && resumed,
            "paused while the gap was full, then resumed"
        );
        assert_eq!(started, vec![0, max + 1, max + 2, max + 3]);
        assert_eq!(commits(&mut s), vec![(0, max + 4, String::new())]);
    }
}

#[test]
fn a_batch_goes_out_when_its_partition_buffer_or_the_byte_budget_is_full() {
    // Four waiting records fill the partition's buffer: the batch of ten goes out with
    // them rather than wait for records the paused partition will not fetch.
    let mut s = set(4, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 10, 1 << 20),
        Instant::now(),
    );
    for o in 0..3 {
        let _ = s.on_message(msg(0, o, "k"));
    }
    assert!(process(&mut s).starts.is_empty());
    let _ = s.on_message(msg(0, 3, "k"));
    let out = process(&mut s);
    assert_eq!(offsets_of(&out.starts[0]), vec![0, 1, 2, 3]);
    // The byte budget, pressed from half of it on: each record counts 37 bytes and the
    // overhead.
    let mut s = set(100, 4 * (37 + MESSAGE_OVERHEAD));
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 10, 1 << 20),
        Instant::now(),
    );
    let _ = s.on_message(msg(0, 0, "k"));
    assert!(process(&mut s).starts.is_empty());
    let _ = s.on_message(msg(0, 1, "k"));
    assert_eq!(offsets_of(&process(&mut s).starts[0]), vec![0, 1]);
}

#[test]
fn a_waiting_batch_goes_out_at_once_when_its_partition_is_revoked() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 10, 1 << 20),
        Instant::now(),
    );
    s.assign(
        assigned(1, Some(0), ""),
        batch_trigger(8, 10, 1 << 20),
        Instant::now(),
    );
    for o in 0..3 {
        let _ = s.on_message(msg(0, o, "k"));
        let _ = s.on_message(msg(1, o, "k"));
    }
    // Below every bound: nothing goes out yet.
    assert!(process(&mut s).starts.is_empty());
    let mut out = Actions::default();
    s.flush_batches(Instant::now(), Some(&[tp(0)]), &mut out);
    assert_eq!(out.starts.len(), 1, "only the revoked partition");
    let b = out.starts.pop().unwrap();
    assert_eq!(offsets_of(&b), vec![0, 1, 2]);
    s.begin_revoke(&[tp(0)], false);
    let _ = s.on_run_finished(
        b.id,
        b.generation,
        &None,
        &[(0, true), (1, true), (2, true)],
    );
    assert_eq!(s.final_commit(&tp(0)).unwrap().0, 3);
    // A partition with a batch out flushes nothing more; neither does a holding set.
    let mut s2 = set(100, 1 << 20);
    s2.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 2, 1 << 20),
        Instant::now(),
    );
    for o in 0..3 {
        let _ = s2.on_message(msg(0, o, "k"));
    }
    assert_eq!(process(&mut s2).starts.len(), 1);
    let mut out = Actions::default();
    s2.flush_batches(Instant::now(), None, &mut out);
    assert!(out.starts.is_empty());
    s.set_holding(true);
    s.flush_batches(Instant::now(), None, &mut out);
    assert!(out.starts.is_empty());
}

fn batch_trigger(permits: usize, max_records: usize, max_bytes: usize) -> TriggerSlot<TestShell> {
    TriggerSlot {
        batch: Some(BatchLimits {
            max_records,
            max_bytes,
            max_wait: std::time::Duration::from_millis(1000),
        }),
        ..trigger(permits, Ordering::Key)
    }
}

fn offsets_of(start: &Start<TestShell>) -> Vec<i64> {
    std::iter::once(&start.msg)
        .chain(&start.batch)
        .map(Record::offset)
        .collect()
}

#[test]
fn a_batch_goes_out_at_max_records_in_offset_order_one_per_partition_at_a_time() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 3, 1 << 20),
        Instant::now(),
    );
    for o in 0..7 {
        let _ = s.on_message(msg(0, o, if o % 2 == 0 { "a" } else { "b" }));
    }
    let mut out = process(&mut s);
    assert_eq!(out.starts.len(), 1, "one batch of a partition at a time");
    let first = out.starts.pop().unwrap();
    assert_eq!(offsets_of(&first), vec![0, 1, 2]);
    assert!(
        process(&mut s).starts.is_empty(),
        "the next waits for the first"
    );
    // Nothing is committed before the batch is handled.
    assert!(commits(&mut s).is_empty());
    let _ = s.on_run_finished(
        first.id,
        first.generation,
        &None,
        &[(0, true), (1, true), (2, true)],
    );
    assert_eq!(commits(&mut s), vec![(0, 3, String::new())]);
    let second = process(&mut s).starts.pop().unwrap();
    assert_eq!(offsets_of(&second), vec![3, 4, 5]);
    // A record not handled (abandoned) holds the commit below it.
    let _ = s.on_run_finished(
        second.id,
        second.generation,
        &None,
        &[(3, true), (4, false), (5, true)],
    );
    let c = commits(&mut s);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, 4);
    // One record is left: it waits for max_wait.
    let mut out = Actions::default();
    s.process(Instant::now(), &mut out);
    assert!(out.starts.is_empty());
    let due = s.next_batch_due().expect("a wake-up for max_wait");
    s.process(due, &mut out);
    assert_eq!(offsets_of(&out.starts[0]), vec![6]);
    assert!(s.next_batch_due().is_none());
}

#[test]
fn a_batch_respects_max_bytes_and_an_oversized_record_goes_alone() {
    let mut s = set(100, 1 << 20);
    // Each test record has a 36-byte value and a 1-byte key: 37 bytes.
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 100, 80),
        Instant::now(),
    );
    for o in 0..5 {
        let _ = s.on_message(msg(0, o, "k"));
    }
    let b = process(&mut s).starts.pop().unwrap();
    assert_eq!(offsets_of(&b), vec![0, 1]);
    let _ = s.on_run_finished(b.id, b.generation, &None, &[(0, true), (1, true)]);
    let b = process(&mut s).starts.pop().unwrap();
    assert_eq!(offsets_of(&b), vec![2, 3]);
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 100, 10),
        Instant::now(),
    );
    let _ = s.on_message(msg(0, 0, "k"));
    let _ = s.on_message(msg(0, 1, "k"));
    assert_eq!(offsets_of(&process(&mut s).starts[0]), vec![0]);
}

#[test]
fn batches_of_different_partitions_run_in_parallel_up_to_the_permits() {
    let mut s = set(100, 1 << 20);
    let t = batch_trigger(2, 2, 1 << 20);
    for p in 0..3 {
        s.assign(assigned(p, Some(0), ""), t.clone(), Instant::now());
        for o in 0..2 {
            let _ = s.on_message(msg(p, o, "k"));
        }
    }
    let out = process(&mut s);
    assert_eq!(out.starts.len(), 2, "two permits");
    let mut parts: Vec<i32> = out.starts.iter().map(|b| b.msg.partition()).collect();
    parts.sort_unstable();
    parts.dedup();
    assert_eq!(parts.len(), 2);
    let first = out.starts.into_iter().next().unwrap();
    let offsets: Vec<(i64, bool)> = offsets_of(&first).into_iter().map(|o| (o, true)).collect();
    drop(first.permit);
    let _ = s.on_run_finished(first.id, first.generation, &None, &offsets);
    assert_eq!(
        process(&mut s).starts.len(),
        1,
        "the third partition's batch starts"
    );
}

#[test]
fn revoking_drops_a_waiting_batch_and_commits_only_what_was_handled() {
    let mut s = set(100, 1 << 20);
    s.assign(
        assigned(0, Some(0), ""),
        batch_trigger(8, 2, 1 << 20),
        Instant::now(),
    );
    for o in 0..3 {
        let _ = s.on_message(msg(0, o, "k"));
    }
    let b = process(&mut s).starts.pop().unwrap();
    s.begin_revoke(&[tp(0)], false);
    assert_eq!(s.buffered_bytes(), 0);
    let _ = s.on_run_finished(b.id, b.generation, &None, &[(0, true), (1, true)]);
    assert_eq!(s.final_commit(&tp(0)).unwrap().0, 2);
    assert!(process(&mut s).starts.is_empty());
}

impl Start<TestShell> {
    /// A copy holding a fresh permit-less stand-in, for tests that finish a run and keep
    /// looking at it.
    fn clone_for_test(&self) -> Start<TestShell> {
        Start {
            id: self.id,
            generation: self.generation,
            topic_id: self.topic_id.clone(),
            key: self.key.clone(),
            msg: self.msg.clone(),
            batch: self.batch.clone(),
            permit: TestShell::try_permit(&TestTrigger::new(1)).unwrap(),
            trigger: self.trigger.clone(),
            trigger_index: self.trigger_index,
        }
    }
}

/// The offsets a commit's metadata names as handled.
fn named(offset: i64, metadata: &str) -> Vec<i64> {
    crate::core::offsets::parse_metadata(offset, metadata)
        .iter()
        .collect()
}

/// Issue 34, defect 3: a partition whose commit map might outgrow the brokers' limit starts
/// nothing above its gap but the record at the gap, and pauses; every map it commits fits
/// and names exactly the records handled above its offset; handling the record at the gap
/// lets it go on.
#[test]
fn a_partition_whose_commit_map_would_outgrow_its_budget_runs_only_the_record_at_the_gap() {
    let budget = 12;
    let mut s = PartitionSet::new(Limits {
        per_partition: 1_000,
        max_bytes: 1 << 30,
        max_tracked_above: crate::core::offsets::MAX_TRACKED_ABOVE,
        metadata_max_chars: budget,
    });
    s.assign(
        assigned(0, Some(0), ""),
        trigger(64, Ordering::Key),
        Instant::now(),
    );
    // One record per transaction (markers at odd offsets); key "p" every fourth offset,
    // parked at 0 (its later records wait behind it), other keys in between.
    let key = |o: i64| {
        if o % 4 == 0 {
            "p".to_owned()
        } else {
            format!("k{o}")
        }
    };
    let mut parked = None;
    let mut handled = std::collections::BTreeSet::new();
    let mut paused = false;
    for o in (0..200).step_by(2) {
        let _ = s.on_message(msg(0, o, &key(o)));
        s.on_position(&tp(0), Some(o + 2));
        let out = process(&mut s);
        paused |= out.pause.contains(&tp(0));
        for st in out.starts {
            let offset = st.msg.offset();
            if offset == 0 {
                parked = Some(st);
            } else {
                assert!(!paused, "{offset} started above a full map");
                let _ = handled.insert(offset);
                finish(&mut s, st, true);
            }
        }
        for (_, offset, metadata) in commits(&mut s) {
            assert!(metadata.len() <= budget, "{metadata}");
            let map = crate::core::offsets::parse_metadata(offset, &metadata);
            for r in (offset..o + 1).step_by(2) {
                assert_eq!(map.contains(r), handled.contains(&r), "{r} in {metadata:?}");
            }
        }
    }
    assert!(paused, "the map filled");
    let ran = handled.len();
    assert!(ran > 3 && ran < 75, "{ran} ran above the gap");
    assert_eq!(
        s.by_tp(&tp(0)).unwrap().tracker.gap_hold(1),
        Some(crate::core::offsets::GapHold::Metadata)
    );
    // The parked record is handled: the partition goes on.
    finish(&mut s, parked.expect("the record at the gap started"), true);
    let mut resumed = false;
    for _ in 0..200 {
        let out = process(&mut s);
        resumed |= out.resume.contains(&tp(0));
        if out.starts.is_empty() {
            break;
        }
        for st in out.starts {
            finish(&mut s, st, true);
        }
    }
    assert!(resumed);
    assert_eq!(commits(&mut s), vec![(0, 200, String::new())]);
}

#[test]
fn a_commit_made_under_an_older_topic_of_the_same_name_is_read_anew() {
    let mut s = set(100, 1 << 20);
    let with_id = |metadata: &str, id: Option<&str>| AssignedPartition {
        topic_id: id.map(Arc::from),
        ..assigned(0, Some(50), metadata)
    };
    // The commit names the topic's own id: read as today.
    s.assign(
        with_id("tk3:id-2:50:bAQ", Some("id-2")),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    assert!(s.committed_under_other_topic(&tp(0)).is_none());
    assert!(s.restart_stale_commit(&tp(0)).is_none());
    assert_eq!(s.by_tp(&tp(0)).unwrap().tracker.stored_offset(), Some(50));
    // No id in the commit, or none known for the topic: as today.
    for (metadata, id) in [
        ("tk2:50:bAQ", Some("id-2")),
        ("", Some("id-2")),
        ("tk3:id-1:50:", None),
    ] {
        s.assign(
            with_id(metadata, id),
            trigger(4, Ordering::Key),
            Instant::now(),
        );
        assert!(s.restart_stale_commit(&tp(0)).is_none(), "{metadata}");
        assert_eq!(s.by_tp(&tp(0)).unwrap().tracker.stored_offset(), Some(50));
    }
    // Another id: the commit is an older topic's. The partition starts with nothing
    // committed, takes nothing until the consumer moved, then reads the log from there.
    s.assign(
        with_id("tk3:id-1:50:bAQ", Some("id-2")),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    assert_eq!(
        s.committed_under_other_topic(&tp(0)),
        Some((Arc::from("id-1"), Arc::from("id-2")))
    );
    assert!(s.restart_stale_commit(&tp(0)).is_some());
    assert!(s.committed_under_other_topic(&tp(0)).is_none());
    let p = s.by_tp(&tp(0)).unwrap();
    assert_eq!(p.tracker.stored_offset(), None);
    assert_eq!(p.topic_id.as_deref(), Some("id-2"));
    assert!(matches!(
        s.on_message(msg(0, 50, "a")),
        Arrival::BeforeSeek(_)
    ));
    s.on_sought(&tp(0));
    for (o, key) in [(0, "a"), (1, "b"), (2, "c")] {
        assert!(
            matches!(s.on_message(msg(0, o, key)), Arrival::Queued(_)),
            "{o}"
        );
    }
    for x in process(&mut s).starts {
        finish(&mut s, x, true);
    }
    // Its commits follow the new log, naming the new id.
    assert_eq!(commits(&mut s), vec![(0, 3, "tk3:id-2:3:".to_owned())]);
}

#[test]
fn a_topic_id_read_after_the_assignment_finds_an_older_topics_commit() {
    let mut s = set(100, 1 << 20);
    // The ids could not be read at the assignment.
    s.assign(
        assigned(0, Some(50), "tk3:id-1:50:"),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    assert!(s.committed_under_other_topic(&tp(0)).is_none());
    assert!(matches!(s.on_message(msg(0, 50, "a")), Arrival::Queued(_)));
    // The same id: nothing changes.
    let mut same = set(100, 1 << 20);
    same.assign(
        assigned(0, Some(50), "tk3:id-1:50:"),
        trigger(4, Ordering::Key),
        Instant::now(),
    );
    assert!(!same.verify_topic_id(&tp(0), Some("id-1".into())));
    assert_eq!(
        same.by_tp(&tp(0)).unwrap().tracker.stored_offset(),
        Some(50)
    );
    // Another: the partition restarts, and the consumer is to move.
    assert!(s.verify_topic_id(&tp(0), Some("id-2".into())));
    let p = s.by_tp(&tp(0)).unwrap();
    assert_eq!(p.tracker.stored_offset(), None);
    assert_eq!(p.topic_id.as_deref(), Some("id-2"));
    assert!(matches!(
        s.on_message(msg(0, 51, "b")),
        Arrival::BeforeSeek(_)
    ));
    // Read again with the same id later: nothing more.
    s.on_sought(&tp(0));
    assert!(!s.verify_topic_id(&tp(0), Some("id-2".into())));
}
