//! What one answer means for the records of the request it answers: the part of the attempt
//! loop that a trigger's runs ([`super::attempt`]) and `dlq replay` ([`crate::ops::replay`])
//! share. Pure: an answer in, a [`Verdict`] out; every branch is unit-tested.
//!
//! A request carries a group of records: one, or a batch's. Its answer either sends the group
//! again at once (a batch's first 409, under a key of its own; a refused batch, as two halves
//! until the refused record is alone), or settles it: some records accepted, the others
//! failed, to be retried after the backoff or given up with an error class ([`decide`]).
//! What stays with the caller: where the groups wait (a stack, the next on top), how its
//! records' transient failures are counted ([`Member::transient`] in, [`Failed::counted`]
//! out), the backoff, and what giving up does (`on_error` for a run, a report for a replay).

use super::decide::{decide, Next, Observed, RetryPolicy};
use crate::dispatch::batch;
use crate::dispatch::DispatchOutcome;

/// The request an answer is to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// One record's event under the record's own key: 2xx and 409 accept it.
    Single,
    /// A batch ([`batch::request_key`]); `rekeyed` once its group went again under a key of
    /// its own after a 409 ([`batch::conflict_key`]).
    Batch {
        /// Whether this request carried a conflict key.
        rekeyed: bool,
    },
}

impl Request {
    /// The request of a run (or a replay) that sends batches when `batch`; `conflict_nonce`
    /// is set once a 409 had it send its batches under keys of their own.
    pub(crate) fn of(batch: bool, conflict_nonce: Option<u64>) -> Self {
        match batch {
            false => Request::Single,
            true => Request::Batch {
                rekeyed: conflict_nonce.is_some(),
            },
        }
    }
}

/// A record the request carried, in offset order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member<'a> {
    /// Its index among the caller's records (what a [`Verdict`] names it by).
    pub(crate) index: usize,
    /// Its event id, as a partial-failure answer names it.
    pub(crate) id: &'a str,
    /// Its Kafka key: a failed record holds back the later records of its key.
    pub(crate) key: Option<&'a [u8]>,
    /// Its transient failures so far (the retry budget [`decide`] counts).
    pub(crate) transient: u32,
}

/// What becomes of the group a request carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A batch's first 409: its key was used before, which says nothing of which events that
    /// request had accepted. The caller sets a conflict nonce and sends the group again at
    /// once, under a key of its own, whose answer counts.
    Rekey,
    /// A batch the dispatcher refused (4xx): its halves, earlier offsets first, are sent at
    /// once, `first` first, until the refused record is alone.
    Split {
        /// The earlier half (record indices).
        first: Vec<usize>,
        /// The later half.
        second: Vec<usize>,
    },
    /// The answer settles the group: `accepted` are accepted, `failed` failed.
    Settled {
        /// The records accepted (indices, in offset order).
        accepted: Vec<usize>,
        /// The records that failed and what becomes of them; None when every one was accepted.
        failed: Option<Failed>,
    },
}

/// The records of a settled group that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failed {
    /// Their indices, in offset order: the whole group, or, after a partial failure, the
    /// events the answer named and the later records of their keys.
    pub(crate) records: Vec<usize>,
    /// Some when the dispatcher accepted the batch but for these.
    pub(crate) partial: Option<Partial>,
    /// Whether the failure is transient: one more against each record's retry budget (the
    /// caller adds it to its counts).
    pub(crate) counted: bool,
    /// The transient failures [`decide`] weighed: the most a record of `records` has had,
    /// this one included.
    pub(crate) transient: u32,
    /// Retried after the backoff, given up with an error class, or a configuration error.
    pub(crate) next: Next,
}

/// A batch the dispatcher accepted but for some events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Partial {
    /// How many events its answer named failed (every event of the batch when it could not
    /// be read).
    pub(crate) named: usize,
    /// Why the answer's `failed` could not be read, when it could not: no event counts as
    /// accepted then.
    pub(crate) unreadable: Option<String>,
}

/// What `outcome` (and `answer`, the body a batch's 2xx kept) says of the records `group`
/// (never empty) that `request` carried, with the retry settings `policy`.
pub(crate) fn read(
    request: Request,
    outcome: &DispatchOutcome,
    answer: &[u8],
    group: &[Member<'_>],
    policy: &RetryPolicy,
) -> Verdict {
    let observed = match outcome {
        DispatchOutcome::Accepted { status } => {
            return match request {
                Request::Single => settled(group, Vec::new(), None, policy),
                Request::Batch { rekeyed: false } if *status == 409 => Verdict::Rekey,
                Request::Batch { .. } => partly(group, answer, policy),
            }
        }
        DispatchOutcome::Rejected { .. } => {
            let all: Vec<usize> = group.iter().map(|m| m.index).collect();
            if let Some((first, second)) = batch::bisect(&all) {
                return Verdict::Split { first, second };
            }
            Observed::Rejected
        }
        DispatchOutcome::Retryable { retry_after, .. } => Observed::Retryable {
            retry_after: *retry_after,
        },
        DispatchOutcome::Invalid { .. } => Observed::Invalid,
        DispatchOutcome::Unauthorized { .. } => Observed::Unauthorized,
    };
    let failed = (0..group.len()).collect();
    Verdict::Settled {
        accepted: Vec::new(),
        failed: Some(fail(group, failed, observed, None, policy)),
    }
}

/// A batch's 2xx (or a 409 to a key of its own): every event accepted but those the answer
/// names failed and the later records of their keys; none when the answer cannot be read.
fn partly(group: &[Member<'_>], answer: &[u8], policy: &RetryPolicy) -> Verdict {
    let (retry, partial) = match batch::failed_ids(answer) {
        Ok(named) => {
            let keyed: Vec<(&str, Option<&[u8]>)> = group.iter().map(|m| (m.id, m.key)).collect();
            let retry = batch::to_retry(&keyed, &named);
            let partial = Partial {
                named: named.len(),
                unreadable: None,
            };
            (retry, partial)
        }
        Err(reason) => {
            let partial = Partial {
                named: group.len(),
                unreadable: Some(reason),
            };
            ((0..group.len()).collect(), partial)
        }
    };
    settled(group, retry, Some(partial), policy)
}

/// The group settled with the records at `retry` (positions in `group`) failed transiently.
fn settled(
    group: &[Member<'_>],
    retry: Vec<usize>,
    partial: Option<Partial>,
    policy: &RetryPolicy,
) -> Verdict {
    let accepted = (0..group.len())
        .filter(|j| !retry.contains(j))
        .map(|j| group[j].index)
        .collect();
    let failed = (!retry.is_empty()).then(|| {
        let observed = Observed::Retryable { retry_after: None };
        fail(group, retry, observed, partial, policy)
    });
    Verdict::Settled { accepted, failed }
}

/// The records at `failed` (positions in `group`) failed as `observed` says.
fn fail(
    group: &[Member<'_>],
    failed: Vec<usize>,
    observed: Observed,
    partial: Option<Partial>,
    policy: &RetryPolicy,
) -> Failed {
    let counted = matches!(observed, Observed::Retryable { .. });
    let most = failed
        .iter()
        .map(|&j| group[j].transient)
        .max()
        .unwrap_or_default();
    let transient = if counted {
        most.saturating_add(1)
    } else {
        most
    };
    Failed {
        records: failed.into_iter().map(|j| group[j].index).collect(),
        partial,
        counted,
        transient,
        next: decide(observed, transient, policy),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::run::WorkOutcome;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        schema_not_found: Duration::from_secs(60),
    };
    const RETRY: Next = Next::Retry { retry_after: None };

    fn accepted(status: u16) -> DispatchOutcome {
        DispatchOutcome::Accepted { status }
    }

    fn retryable(retry_after: Option<Duration>) -> DispatchOutcome {
        DispatchOutcome::Retryable {
            status: Some(503),
            reason: "HTTP 503".to_owned(),
            retry_after,
        }
    }

    fn rejected() -> DispatchOutcome {
        DispatchOutcome::Rejected {
            status: 422,
            reason: "no".to_owned(),
        }
    }

    /// Records `a0, b1, a2, c3, …`: ids of their key's letter and their index; keys cycle
    /// through a, b, c.
    struct Records {
        ids: Vec<String>,
        transient: Vec<u32>,
    }

    impl Records {
        fn new(n: usize) -> Self {
            Self {
                ids: (0..n)
                    .map(|i| format!("{}{i}", ["a", "b", "c"][i % 3]))
                    .collect(),
                transient: vec![0; n],
            }
        }

        fn group(&self, group: &[usize]) -> Vec<Member<'_>> {
            group
                .iter()
                .map(|&i| Member {
                    index: i,
                    id: &self.ids[i],
                    key: Some(&self.ids[i].as_bytes()[..1]),
                    transient: self.transient[i],
                })
                .collect()
        }

        /// The verdict on `outcome` to the request for `group`, with its transient failures
        /// counted as a run counts them.
        fn read(
            &mut self,
            request: Request,
            group: &[usize],
            outcome: &DispatchOutcome,
            answer: &[u8],
        ) -> Verdict {
            let verdict = read(request, outcome, answer, &self.group(group), &POLICY);
            if let Verdict::Settled {
                failed: Some(f), ..
            } = &verdict
            {
                if f.counted {
                    for &i in &f.records {
                        self.transient[i] += 1;
                    }
                }
            }
            verdict
        }
    }

    fn settled(accepted: Vec<usize>, failed: Option<Failed>) -> Verdict {
        Verdict::Settled { accepted, failed }
    }

    #[test]
    fn a_single_record_is_accepted_by_2xx_and_409_alike() {
        let mut r = Records::new(1);
        for status in [200, 202, 409] {
            assert_eq!(
                r.read(Request::Single, &[0], &accepted(status), b""),
                settled(vec![0], None)
            );
        }
        // A single record's answer body is never read as a partial failure.
        assert_eq!(
            r.read(
                Request::Single,
                &[0],
                &accepted(200),
                br#"{"failed": ["a0"]}"#
            ),
            settled(vec![0], None)
        );
    }

    #[test]
    fn a_batch_answered_409_goes_again_under_its_own_key_whose_409_accepts_it() {
        let mut r = Records::new(3);
        let group = [0, 1, 2];
        let first = Request::of(true, None);
        assert_eq!(first, Request::Batch { rekeyed: false });
        assert_eq!(r.read(first, &group, &accepted(409), b""), Verdict::Rekey);
        // The first 409 is not a failure: nothing counted.
        assert_eq!(r.transient, [0, 0, 0]);
        let again = Request::of(true, Some(7));
        assert_eq!(again, Request::Batch { rekeyed: true });
        assert_eq!(
            r.read(again, &group, &accepted(409), b""),
            settled(vec![0, 1, 2], None)
        );
        // A 2xx to the first key accepts it at once.
        assert_eq!(
            r.read(first, &group, &accepted(202), b""),
            settled(vec![0, 1, 2], None)
        );
    }

    #[test]
    fn a_partial_failure_retries_the_named_events_and_the_later_ones_of_their_keys() {
        // a0 b1 c2 a3 b4 c5: b1 named failed holds b4 back; c5 failed alone.
        let mut r = Records::new(6);
        let group: Vec<usize> = (0..6).collect();
        let request = Request::Batch { rekeyed: false };
        let answer = br#"{"failed": ["b1", "c5", "not-in-the-batch"]}"#;
        let failed = Failed {
            records: vec![1, 4, 5],
            partial: Some(Partial {
                named: 3,
                unreadable: None,
            }),
            counted: true,
            transient: 1,
            next: RETRY,
        };
        assert_eq!(
            r.read(request, &group, &accepted(200), answer),
            settled(vec![0, 2, 3], Some(failed))
        );
        assert_eq!(r.transient, [0, 1, 0, 0, 1, 1]);
        // The failed ones again: the answer counts against their own budget only.
        let failed = Failed {
            records: vec![4],
            partial: Some(Partial {
                named: 1,
                unreadable: None,
            }),
            counted: true,
            transient: 2,
            next: RETRY,
        };
        assert_eq!(
            r.read(
                request,
                &[1, 4, 5],
                &accepted(200),
                br#"{"failed": ["b4"]}"#
            ),
            settled(vec![1, 5], Some(failed))
        );
        // An answer naming no event of the batch accepts it all.
        assert_eq!(
            r.read(request, &[4], &accepted(200), br#"{"failed": []}"#),
            settled(vec![4], None)
        );
    }

    #[test]
    fn an_unreadable_partial_answer_accepts_nothing_and_retries_the_whole_batch() {
        let mut r = Records::new(4);
        let group = [0, 1, 2, 3];
        let request = Request::Batch { rekeyed: true };
        let Verdict::Settled {
            accepted,
            failed: Some(failed),
        } = r.read(request, &group, &accepted(200), br#"{"failed": "b1"}"#)
        else {
            panic!("settled with failures");
        };
        assert!(accepted.is_empty());
        assert_eq!(failed.records, group);
        assert_eq!(failed.next, RETRY);
        assert!(failed.counted);
        let partial = failed.partial.expect("a partial failure");
        assert_eq!(partial.named, 4);
        assert!(partial.unreadable.is_some());
    }

    #[test]
    fn a_refused_batch_is_halved_down_to_the_refused_record_which_fails() {
        // A dispatcher that refuses every request holding record 5 of 8.
        let mut r = Records::new(8);
        let request = Request::Batch { rekeyed: false };
        let mut stack = vec![(0..8).collect::<Vec<usize>>()];
        let mut sent = Vec::new();
        let mut fate = Vec::new();
        while let Some(group) = stack.pop() {
            let outcome = if group.contains(&5) {
                rejected()
            } else {
                accepted(200)
            };
            sent.push(group.clone());
            match r.read(request, &group, &outcome, b"") {
                Verdict::Split { first, second } => {
                    stack.push(second);
                    stack.push(first);
                }
                Verdict::Settled { accepted, failed } => {
                    fate.extend(
                        accepted
                            .into_iter()
                            .map(|i| (i, Next::Done(WorkOutcome::Accepted))),
                    );
                    if let Some(f) = failed {
                        assert!(!f.counted, "a refusal is no transient failure");
                        fate.extend(f.records.into_iter().map(|i| (i, f.next)));
                    }
                }
                Verdict::Rekey => unreachable!(),
            }
        }
        let groups: [&[usize]; 5] = [
            &[0, 1, 2, 3, 4, 5, 6, 7],
            &[0, 1, 2, 3],
            &[4, 5, 6, 7],
            &[4, 5],
            &[4],
        ];
        assert_eq!(&sent[..5], groups, "earlier offsets first");
        assert_eq!(sent[5..], [vec![5], vec![6, 7]]);
        fate.sort_unstable_by_key(|f| f.0);
        let accepted = Next::Done(WorkOutcome::Accepted);
        let want: Vec<(usize, Next)> = (0..8)
            .map(|i| match i {
                5 => (i, Next::Fail("dispatch_rejected")),
                _ => (i, accepted),
            })
            .collect();
        assert_eq!(fate, want);
        assert_eq!(r.transient, [0; 8]);
    }

    #[test]
    fn transient_failures_count_and_permanent_ones_do_not() {
        let mut r = Records::new(2);
        let ra = Some(Duration::from_secs(2));
        for request in [Request::Single, Request::Batch { rekeyed: false }] {
            let group: &[usize] = match request {
                Request::Single => &[0],
                Request::Batch { .. } => &[0, 1],
            };
            r.transient = vec![0, 0];
            let verdict = r.read(request, group, &retryable(ra), b"");
            let want = Failed {
                records: group.to_vec(),
                partial: None,
                counted: true,
                transient: 1,
                next: Next::Retry { retry_after: ra },
            };
            assert_eq!(verdict, settled(vec![], Some(want)), "{request:?}");
        }
        let single = |outcome: DispatchOutcome, next: Next| {
            let mut r = Records::new(1);
            r.transient = vec![2];
            let want = Failed {
                records: vec![0],
                partial: None,
                counted: false,
                transient: 2,
                next,
            };
            assert_eq!(
                r.read(Request::Single, &[0], &outcome, b""),
                settled(vec![], Some(want)),
                "{outcome:?}"
            );
            assert_eq!(r.transient, [2], "not counted");
        };
        single(rejected(), Next::Fail("dispatch_rejected"));
        single(
            DispatchOutcome::Invalid {
                reason: "bad header".to_owned(),
            },
            Next::Fail("request_invalid"),
        );
        single(
            DispatchOutcome::Unauthorized {
                status: 401,
                reason: "check dispatcher.token".to_owned(),
            },
            Next::Stop,
        );
    }

    #[test]
    fn retries_run_out_per_record_whole_batch_or_partial() {
        let mut r = Records::new(3);
        let group = [0, 1, 2];
        let request = Request::Batch { rekeyed: false };
        r.transient = vec![0, 1, 0];
        let next = |v: Verdict| match v {
            Verdict::Settled {
                failed: Some(f), ..
            } => (f.transient, f.next),
            other => panic!("{other:?}"),
        };
        // The whole batch failed: the most any record has had decides.
        assert_eq!(
            next(r.read(request, &group, &retryable(None), b"")),
            (2, RETRY)
        );
        assert_eq!(r.transient, [1, 2, 1]);
        // A partial failure counts for the records that failed only: c2's second failure is
        // within the budget (b1's would not be), its third is not.
        let named = br#"{"failed": ["c2"]}"#;
        assert_eq!(
            next(r.read(request, &group, &accepted(200), named)),
            (2, RETRY)
        );
        assert_eq!(
            next(r.read(request, &[2], &accepted(200), named)),
            (3, Next::Fail("retries_exhausted"))
        );
        assert_eq!(
            next(r.read(request, &[0, 1], &retryable(None), b"")),
            (3, Next::Fail("retries_exhausted"))
        );
        assert_eq!(r.transient, [2, 3, 3]);
        // No limit with max_attempts = 0.
        let unlimited = RetryPolicy {
            max_attempts: 0,
            ..POLICY
        };
        let members = r.group(&group);
        let v = read(request, &retryable(None), b"", &members, &unlimited);
        assert_eq!(next(v), (4, RETRY));
    }
}
