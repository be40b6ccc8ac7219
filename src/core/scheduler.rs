//! Which waiting message of a partition may start next, per the trigger's ordering.
//!
//! `key`: a message starts only when no earlier message with the same key in its partition is
//! waiting or in flight; messages without a key form one sequence of their own. `partition`:
//! one message in flight per partition, in offset order. `unordered`: any message. Pure.

use std::collections::{HashMap, VecDeque};

use crate::core::types::Ordering;

/// A message key (None: no key; such messages form one sequence of their own).
pub(super) type Key = Option<Vec<u8>>;

/// A partition's waiting messages and the keys it has in flight. Every operation is O(1)
/// (amortised): with `key` ordering each key has its own queue, and keys that may start are
/// kept in a queue of their own, so a start never scans the waiting messages.
#[derive(Debug)]
pub struct PartitionQueue<T> {
    ordering: Ordering,
    /// `partition` and `unordered`: the waiting messages in offset order.
    fifo: VecDeque<(Key, T)>,
    /// `key`: per key with something waiting or in flight, its waiting messages in offset
    /// order and whether one is in flight.
    keys: HashMap<Key, KeyQueue<T>>,
    /// `key`: keys with a waiting message and none in flight, in the order they became so.
    ready: VecDeque<Key>,
    waiting: usize,
    in_flight: usize,
}

#[derive(Debug)]
struct KeyQueue<T> {
    waiting: VecDeque<T>,
    in_flight: bool,
}

impl<T> PartitionQueue<T> {
    /// An empty queue.
    pub fn new(ordering: Ordering) -> Self {
        Self {
            ordering,
            fifo: VecDeque::new(),
            keys: HashMap::new(),
            ready: VecDeque::new(),
            waiting: 0,
            in_flight: 0,
        }
    }

    /// Appends a message (in offset order).
    pub fn push(&mut self, key: Key, item: T) {
        self.waiting += 1;
        if self.ordering != Ordering::Key {
            self.fifo.push_back((key, item));
            return;
        }
        match self.keys.get_mut(&key) {
            Some(k) => k.waiting.push_back(item),
            None => {
                let _ = self.keys.insert(
                    key.clone(),
                    KeyQueue {
                        waiting: VecDeque::from([item]),
                        in_flight: false,
                    },
                );
                self.ready.push_back(key);
            }
        }
    }

    /// Removes and returns the first message allowed to start, marking its key in flight.
    pub fn pop_startable(&mut self) -> Option<(Key, T)> {
        self.pop_startable_if(|_| true)
    }

    /// Removes and returns the first waiting message `wanted` picks that ordering lets start
    /// now, marking its key in flight. With a `wanted` that picks anything this is O(1); a
    /// choosier one (the record at a full gap) may look through the ready keys, which is
    /// bounded by the keys waiting and happens only in that rare state.
    pub fn pop_startable_if(&mut self, wanted: impl Fn(&T) -> bool) -> Option<(Key, T)> {
        let popped = match self.ordering {
            Ordering::Unordered | Ordering::Partition
                if (self.ordering == Ordering::Unordered || self.in_flight == 0)
                    && self.fifo.front().is_some_and(|(_, t)| wanted(t)) =>
            {
                self.fifo.pop_front()
            }
            Ordering::Unordered | Ordering::Partition => None,
            Ordering::Key => {
                let keys = &self.keys;
                let at = self.ready.iter().position(|key| {
                    keys.get(key)
                        .and_then(|k| k.waiting.front())
                        .is_some_and(&wanted)
                })?;
                let key = self.ready.remove(at)?;
                let k = self.keys.get_mut(&key)?;
                let item = k.waiting.pop_front()?;
                k.in_flight = true;
                Some((key, item))
            }
        };
        if popped.is_some() {
            self.waiting -= 1;
            self.in_flight += 1;
        }
        popped
    }

    /// `partition` ordering (batch triggers): removes and returns the first waiting message
    /// whatever is in flight (a batch takes several at once).
    pub fn pop_fifo(&mut self) -> Option<(Key, T)> {
        let popped = self.fifo.pop_front();
        if popped.is_some() {
            self.waiting -= 1;
            self.in_flight += 1;
        }
        popped
    }

    /// `partition` and `unordered` ordering: the waiting messages, in offset order.
    pub fn iter_fifo(&self) -> impl Iterator<Item = &T> {
        self.fifo.iter().map(|(_, t)| t)
    }

    /// A started message finished (accepted, skipped or abandoned).
    pub fn finished(&mut self, key: &Key) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.ordering != Ordering::Key {
            return;
        }
        let Some(k) = self.keys.get_mut(key) else {
            return;
        };
        k.in_flight = false;
        if k.waiting.is_empty() {
            let _ = self.keys.remove(key);
        } else {
            self.ready.push_back(key.clone());
        }
    }

    /// A started message comes back without an outcome (its run ended outside a revoke
    /// without handling it): it waits again at the head of its key (or of the partition), so
    /// no later message of its key starts before it. Give a batch's records back last first.
    pub fn requeue(&mut self, key: Key, item: T) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.waiting += 1;
        if self.ordering != Ordering::Key {
            self.fifo.push_front((key, item));
            return;
        }
        let k = self.keys.entry(key.clone()).or_insert_with(|| KeyQueue {
            waiting: VecDeque::new(),
            in_flight: false,
        });
        k.waiting.push_front(item);
        k.in_flight = false;
        self.ready.push_front(key);
    }

    /// Messages waiting to start.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Messages started and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Drops every waiting message (revoke, shutdown); keys in flight stay in flight.
    pub fn clear_waiting(&mut self) -> Vec<T> {
        self.waiting = 0;
        let mut out: Vec<T> = self.fifo.drain(..).map(|(_, t)| t).collect();
        self.ready.clear();
        self.keys.retain(|_, k| {
            out.extend(k.waiting.drain(..));
            k.in_flight
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    #[test]
    fn same_key_waits_other_keys_start() {
        let mut q = PartitionQueue::new(Ordering::Key);
        q.push(k("a"), 0);
        q.push(k("a"), 1);
        q.push(k("b"), 2);
        q.push(None, 3);
        q.push(None, 4);
        assert_eq!(q.pop_startable().map(|x| x.1), Some(0));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(2));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(3));
        assert_eq!(q.pop_startable().map(|x| x.1), None);
        q.finished(&k("a"));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(1));
        q.finished(&None);
        assert_eq!(q.pop_startable().map(|x| x.1), Some(4));
        assert_eq!(q.in_flight(), 3);
    }

    #[test]
    fn a_requeued_message_starts_before_the_later_ones_of_its_key() {
        let mut q = PartitionQueue::new(Ordering::Key);
        q.push(k("a"), 0);
        q.push(k("a"), 1);
        q.push(k("b"), 2);
        assert_eq!(q.pop_startable().map(|x| x.1), Some(0));
        q.requeue(k("a"), 0);
        assert_eq!((q.waiting(), q.in_flight()), (3, 0));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(0));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(2));
        assert_eq!(q.pop_startable().map(|x| x.1), None, "1 waits for 0");
        let mut fifo = PartitionQueue::new(Ordering::Partition);
        for i in 0..3 {
            fifo.push(None, i);
        }
        let (a, b) = (fifo.pop_fifo().unwrap(), fifo.pop_fifo().unwrap());
        fifo.requeue(b.0, b.1);
        fifo.requeue(a.0, a.1);
        assert_eq!(fifo.iter_fifo().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn clearing_keeps_keys_in_flight_and_frees_the_rest() {
        let mut q = PartitionQueue::new(Ordering::Key);
        q.push(k("a"), 0);
        q.push(k("a"), 1);
        q.push(k("b"), 2);
        assert_eq!(q.pop_startable().map(|x| x.1), Some(0));
        let mut dropped = q.clear_waiting();
        dropped.sort_unstable();
        assert_eq!(dropped, vec![1, 2]);
        assert_eq!((q.waiting(), q.in_flight()), (0, 1));
        // A new message of the key in flight still waits for it.
        q.push(k("a"), 3);
        assert!(q.pop_startable().is_none());
        q.finished(&k("a"));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(3));
        q.finished(&k("a"));
        assert!(
            q.keys.is_empty() && q.ready.is_empty(),
            "nothing kept for idle keys"
        );
    }

    #[test]
    fn a_start_behind_a_long_parked_key_does_not_scan_it() {
        // 100,000 messages of a parked key, then one of another key: the other key starts at
        // once, and the parked key's messages are not looked at (the test would take seconds
        // with a scan per start).
        let mut q = PartitionQueue::new(Ordering::Key);
        q.push(k("parked"), 0);
        assert!(q.pop_startable().is_some());
        for i in 1..100_000 {
            q.push(k("parked"), i);
        }
        for i in 0..10_000 {
            q.push(k(&format!("other{i}")), 100_000 + i);
            assert_eq!(q.pop_startable().map(|x| x.1), Some(100_000 + i));
        }
        assert!(q.pop_startable().is_none());
        assert_eq!(q.waiting(), 99_999);
    }

    #[test]
    fn partition_ordering_is_one_at_a_time() {
        let mut q = PartitionQueue::new(Ordering::Partition);
        q.push(k("a"), 0);
        q.push(k("b"), 1);
        assert_eq!(q.pop_startable().map(|x| x.1), Some(0));
        assert!(q.pop_startable().is_none());
        q.finished(&k("a"));
        assert_eq!(q.pop_startable().map(|x| x.1), Some(1));
    }

    #[test]
    fn unordered_starts_everything() {
        let mut q = PartitionQueue::new(Ordering::Unordered);
        q.push(k("a"), 0);
        q.push(k("a"), 1);
        assert!(q.pop_startable().is_some());
        assert!(q.pop_startable().is_some());
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn key_order_holds_under_random_completion() {
        // Simulate: 500 messages over 7 keys; complete in-flight messages in a scrambled
        // order; every key's messages must start in offset order.
        let mut q = PartitionQueue::new(Ordering::Key);
        for i in 0..500u32 {
            q.push(k(&format!("k{}", (i * 31) % 7)), i);
        }
        let mut started: Vec<(Option<Vec<u8>>, u32)> = Vec::new();
        let mut in_flight: Vec<(Option<Vec<u8>>, u32)> = Vec::new();
        let mut seed = 7u64;
        while q.waiting() > 0 || !in_flight.is_empty() {
            while in_flight.len() < 5 {
                match q.pop_startable() {
                    Some(x) => {
                        started.push(x.clone());
                        in_flight.push(x);
                    }
                    None => break,
                }
            }
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (seed >> 33) as usize % in_flight.len();
            let (key, _) = in_flight.swap_remove(i);
            q.finished(&key);
        }
        assert_eq!(started.len(), 500);
        let mut last: HashMap<Option<Vec<u8>>, u32> = HashMap::new();
        for (key, off) in started {
            if let Some(prev) = last.insert(key, off) {
                assert!(prev < off);
            }
        }
    }
}
