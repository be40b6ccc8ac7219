//! Which waiting message of a partition may start next, per the trigger's ordering.
//!
//! `key`: a message starts only when no earlier message with the same key in its partition is
//! waiting or in flight; messages without a key form one sequence of their own. `partition`:
//! one message in flight per partition, in offset order. `unordered`: any message. Pure.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::config::Ordering;

/// A partition's waiting messages and the keys it has in flight.
#[derive(Debug)]
pub struct PartitionQueue<T> {
    ordering: Ordering,
    waiting: VecDeque<(Option<Vec<u8>>, T)>,
    in_flight_keys: HashMap<Option<Vec<u8>>, usize>,
    in_flight: usize,
}

impl<T> PartitionQueue<T> {
    /// An empty queue.
    pub fn new(ordering: Ordering) -> Self {
        Self {
            ordering,
            waiting: VecDeque::new(),
            in_flight_keys: HashMap::new(),
            in_flight: 0,
        }
    }

    /// Appends a message (in offset order).
    pub fn push(&mut self, key: Option<Vec<u8>>, item: T) {
        self.waiting.push_back((key, item));
    }

    /// Removes and returns the first message allowed to start, marking its key in flight.
    pub fn pop_startable(&mut self) -> Option<(Option<Vec<u8>>, T)> {
        let index = match self.ordering {
            Ordering::Unordered => (!self.waiting.is_empty()).then_some(0),
            Ordering::Partition => (self.in_flight == 0 && !self.waiting.is_empty()).then_some(0),
            Ordering::Key => {
                let mut earlier: HashSet<Option<&[u8]>> = HashSet::new();
                let mut found = None;
                for (i, (key, _)) in self.waiting.iter().enumerate() {
                    let k = key.as_deref();
                    if !earlier.contains(&k) && !self.in_flight_keys.contains_key(key) {
                        found = Some(i);
                        break;
                    }
                    let _ = earlier.insert(k);
                }
                found
            }
        }?;
        let (key, item) = self.waiting.remove(index)?;
        self.in_flight += 1;
        *self.in_flight_keys.entry(key.clone()).or_default() += 1;
        Some((key, item))
    }

    /// A started message finished (accepted, skipped or abandoned).
    pub fn finished(&mut self, key: &Option<Vec<u8>>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(n) = self.in_flight_keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                let _ = self.in_flight_keys.remove(key);
            }
        }
    }

    /// Messages waiting to start.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Messages started and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Drops every waiting message (revoke, shutdown).
    pub fn clear_waiting(&mut self) -> Vec<T> {
        self.waiting.drain(..).map(|(_, t)| t).collect()
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
