//! Which replicas run a connection, from who holds the placement slots: pure, the same on
//! every replica.
//!
//! Each connection ranks the slots by a hash of its name and the slot (rendezvous hashing,
//! with a hash fixed here so that every replica and every version ranks alike). Walking its
//! ranking, the holders of the slots are collected until `want` distinct ones are found
//! (`want` = min(spread, its partitions)); those run it. A slot whose holder is not known
//! (no view of the group yet) counts as a holder of its own, so a replica never starts a
//! connection that a better-informed replica would give to another: learning more only ever
//! adds to what a replica runs. Slots this replica just gave up count as one holder until the
//! group's description says whose they are (most often one newcomer takes them), so a revoke
//! stops only what moves. So a connection runs on at most min(replicas, partitions, spread)
//! replicas, each distinct, and a replica's death leaves every connection it ran with its
//! other replicas.

use std::collections::BTreeMap;

/// Who holds a slot, as far as this replica knows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// This replica.
    Me,
    /// Another member of the region group, by member id.
    Member(String),
    /// The replica or replicas taking over the slots this replica just gave up, not known
    /// yet: counted as one holder (most often one newcomer takes them), so a revoke does not
    /// stop what the next description shows running here still.
    Incoming,
    /// Not known (or between owners): a holder of its own.
    Unknown(u32),
}

/// Where a connection runs: the slots that placed it, in rank order, with their holders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// `(slot, holder)` for each distinct holder, best-ranked first.
    pub holders: Vec<(u32, Holder)>,
}

impl Placed {
    /// The slot that placed it here and its rank among the connection's holders, when it runs
    /// here.
    pub fn here(&self) -> Option<(u32, usize)> {
        self.holders
            .iter()
            .position(|(_, h)| *h == Holder::Me)
            .map(|rank| (self.holders[rank].0, rank))
    }
}

/// 64 bits of FNV-1a over `bytes`, finished with SplitMix64's mixer: fixed forever, since
/// every replica of every version must rank slots alike.
fn hash(connection: &str, slot: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in connection
        .as_bytes()
        .iter()
        .chain(&[0u8])
        .chain(&slot.to_be_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The holders of `connection`: walking its slots from the best-ranked, the first `want`
/// distinct holders (`holder_of` says who holds a slot). Fewer when there are fewer.
pub fn place(
    connection: &str,
    slots: u32,
    want: usize,
    holder_of: impl Fn(u32) -> Holder,
) -> Placed {
    let mut scored: Vec<(u64, u32)> = (0..slots).map(|s| (hash(connection, s), s)).collect();
    let mut holders: Vec<(u32, Holder)> = Vec::with_capacity(want);
    // Usually `want` holders are found within the first few slots: select the best
    // remaining slot each time rather than sorting them all.
    while holders.len() < want && !scored.is_empty() {
        let best = scored
            .iter()
            .enumerate()
            .max_by_key(|(_, (score, slot))| (*score, std::cmp::Reverse(*slot)))
            .map(|(i, _)| i)
            .unwrap_or(0);
        let (_, slot) = scored.swap_remove(best);
        let holder = holder_of(slot);
        if !holders.iter().any(|(_, h)| *h == holder) {
            holders.push((slot, holder));
        }
    }
    Placed { holders }
}

/// What this replica knows of the region group: the slots it holds, and the other members'
/// (from the group's description, which may lag).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knowledge {
    /// Slots of the placement topic.
    pub slots: u32,
    /// The slots this replica holds (its own assignment: authoritative).
    pub mine: std::collections::BTreeSet<u32>,
    /// Other members' slots, by slot: member id. A slot listed for this replica's own
    /// member id is ignored (its own assignment says).
    pub others: BTreeMap<u32, String>,
    /// Slots this replica gave up whose next holder the group's description has not shown
    /// yet.
    pub incoming: std::collections::BTreeSet<u32>,
}

impl Knowledge {
    /// Who holds `slot`.
    pub fn holder(&self, slot: u32) -> Holder {
        if self.mine.contains(&slot) {
            Holder::Me
        } else if let Some(member) = self.others.get(&slot) {
            Holder::Member(member.clone())
        } else if self.incoming.contains(&slot) {
            Holder::Incoming
        } else {
            Holder::Unknown(slot)
        }
    }

    /// This replica gave up `released` (revoked): their next holder is not known yet.
    pub fn release(&mut self, released: &[u32]) {
        for s in released {
            let _ = self.mine.remove(s);
            let _ = self.others.remove(s);
            let _ = self.incoming.insert(*s);
        }
    }

    /// The group's description says who holds which of the others' slots: given-up slots it
    /// shows held are no longer incoming.
    pub fn described(&mut self, others: BTreeMap<u32, String>) {
        self.incoming.retain(|s| !others.contains_key(s));
        self.others = others;
    }

    /// Where each connection of `demand` (name → how many replicas it wants) runs.
    pub fn place_all(&self, demand: &BTreeMap<String, usize>) -> BTreeMap<String, Placed> {
        demand
            .iter()
            .map(|(name, want)| {
                (
                    name.clone(),
                    place(name, self.slots, *want, |s| self.holder(s)),
                )
            })
            .collect()
    }

    /// The connections of `demand` that run here, each with the slot that placed it here
    /// and its rank.
    pub fn here(&self, demand: &BTreeMap<String, usize>) -> BTreeMap<String, (u32, usize)> {
        if self.mine.is_empty() {
            return BTreeMap::new();
        }
        self.place_all(demand)
            .into_iter()
            .filter_map(|(name, p)| p.here().map(|h| (name, h)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A region of `members` replicas whose slots were dealt round the table (slot s to
    /// member s mod members), as seen by member `me` with full knowledge.
    fn dealt(slots: u32, members: u32, me: u32) -> Knowledge {
        let mut k = Knowledge {
            slots,
            ..Knowledge::default()
        };
        for s in 0..slots {
            let m = s % members;
            if m == me {
                let _ = k.mine.insert(s);
            } else {
                let _ = k.others.insert(s, format!("m{m}"));
            }
        }
        k
    }

    fn demand(n: usize, want: usize) -> BTreeMap<String, usize> {
        (0..n).map(|i| (format!("c{i:04}"), want)).collect()
    }

    #[test]
    fn the_ranking_is_fixed_forever() {
        // Replicas of different versions must agree: these values may never change.
        assert_eq!(hash("orders", 0), 0xe80a_6f00_2d52_16db);
        assert_eq!(hash("orders", 59), 0xe714_5ca3_84d5_c6a7);
        let p = place("orders", 60, 60, Holder::Unknown);
        let first: Vec<u32> = p.holders.iter().take(3).map(|(s, _)| *s).collect();
        assert_eq!(first, [13, 6, 33]);
    }

    /// Three replicas, 300 connections of spread 2: each runs on two distinct replicas, and
    /// each replica runs about two thirds of them (a third of the clients every-replica-
    /// runs-all needs, times the spread).
    #[test]
    fn each_connection_runs_on_spread_distinct_replicas_and_the_load_is_even() {
        let d = demand(300, 2);
        let mut runs: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        let mut per_replica = Vec::new();
        for me in 0..3 {
            let here = dealt(60, 3, me).here(&d);
            per_replica.push(here.len());
            for name in here.keys() {
                let _ = runs.entry(name.clone()).or_default().insert(me);
            }
        }
        assert_eq!(runs.len(), 300, "every connection runs somewhere");
        assert!(runs.values().all(|r| r.len() == 2), "on two replicas each");
        assert_eq!(per_replica.iter().sum::<usize>(), 600);
        for n in per_replica {
            assert!(
                (170..=230).contains(&n),
                "{n} of 600 placements on one replica"
            );
        }
    }

    #[test]
    fn a_connection_never_runs_on_more_replicas_than_there_are() {
        let d = demand(50, 3);
        for me in 0..2 {
            let k = dealt(60, 2, me);
            for p in k.place_all(&d).values() {
                let members: BTreeSet<&Holder> = p.holders.iter().map(|(_, h)| h).collect();
                assert_eq!(members.len(), 2, "{p:?}");
            }
        }
        // One replica: every connection once.
        assert_eq!(dealt(60, 1, 0).here(&demand(40, 2)).len(), 40);
    }

    /// Without a view of the others (only its own slots), a replica runs a connection only
    /// when one of its top-`want` slots is its own; learning the others' slots only adds.
    #[test]
    fn learning_the_others_slots_only_adds_to_what_runs_here() {
        let d = demand(300, 2);
        for me in 0..3 {
            let full = dealt(60, 3, me);
            let blind = Knowledge {
                others: BTreeMap::new(),
                ..full.clone()
            };
            let (known, unknown) = (full.here(&d), blind.here(&d));
            assert!(unknown.keys().all(|c| known.contains_key(c)));
            assert!(unknown.len() < known.len());
        }
        // Nothing runs before the replica holds a slot.
        assert!(Knowledge {
            slots: 60,
            ..Knowledge::default()
        }
        .here(&d)
        .is_empty());
    }

    /// A fourth replica takes a quarter of the slots: only placements whose slots moved, or
    /// that the newcomer now ranks above, move; about a quarter of them.
    #[test]
    fn a_fourth_replica_moves_about_a_quarter_of_the_placements() {
        let d = demand(300, 2);
        let placements = |k: &Knowledge| -> BTreeSet<(String, String)> {
            k.place_all(&d)
                .into_iter()
                .flat_map(|(c, p)| {
                    p.holders.into_iter().map(move |(_, h)| {
                        (
                            c.clone(),
                            match h {
                                Holder::Member(m) => m,
                                other => format!("{other:?}"),
                            },
                        )
                    })
                })
                .collect()
        };
        // Everyone's view, by member id; m3 takes every fourth slot of each (a sticky move).
        let view = |owner: &dyn Fn(u32) -> String| Knowledge {
            slots: 60,
            others: (0..60).map(|s| (s, owner(s))).collect(),
            ..Knowledge::default()
        };
        let before = placements(&view(&|s| format!("m{}", s % 3)));
        let after = placements(&view(&|s| {
            if s % 4 == 3 {
                "m3".to_owned()
            } else {
                format!("m{}", s % 3)
            }
        }));
        let moved = before.difference(&after).count();
        assert_eq!(before.len(), 600);
        assert!(
            (100..=220).contains(&moved),
            "{moved} of 600 placements moved"
        );
    }

    /// Slots given up count as one holder until the description says whose they are, so a
    /// revoke stops only what moves, and the description then decides.
    #[test]
    fn released_slots_are_one_holder_until_described() {
        let mut k = dealt(6, 2, 0);
        assert_eq!(k.holder(2), Holder::Me);
        k.release(&[2, 4]);
        assert_eq!(k.holder(2), Holder::Incoming);
        assert_eq!(k.holder(4), Holder::Incoming);
        assert_eq!(k.holder(0), Holder::Me);
        assert_eq!(k.holder(5), Holder::Member("m1".into()));
        // A description (between the phases of a cooperative rebalance) with slot 4 not
        // yet assigned: 2 is now known, 4 is still incoming.
        let mut others: BTreeMap<u32, String> = [(1, "m1"), (2, "m2"), (3, "m1"), (5, "m1")]
            .into_iter()
            .map(|(s, m)| (s, m.to_owned()))
            .collect();
        k.described(others.clone());
        assert_eq!(k.holder(2), Holder::Member("m2".into()));
        assert_eq!(k.holder(4), Holder::Incoming);
        let _ = others.insert(4, "m2".to_owned());
        k.described(others);
        assert_eq!(k.holder(4), Holder::Member("m2".into()));
        assert!(k.incoming.is_empty());
    }

    /// A connection whose two best slots this replica gives up to one newcomer still runs
    /// here when its third-best slot is this replica's.
    #[test]
    fn giving_slots_up_to_one_newcomer_keeps_what_still_runs_here() {
        let d = demand(300, 2);
        let k = dealt(60, 2, 0);
        let before = k.here(&d);
        let released: Vec<u32> = (0..60).filter(|s| s % 4 == 0).collect();
        let mut after = k.clone();
        after.release(&released);
        let kept = after.here(&d);
        // With the newcomer known to hold them all, the same.
        let mut known = k.clone();
        known.release(&released);
        let mut others = known.others.clone();
        others.extend(released.iter().map(|s| (*s, "m9".to_owned())));
        known.described(others);
        assert_eq!(kept, known.here(&d));
        assert!(kept.len() < before.len());
    }
}
