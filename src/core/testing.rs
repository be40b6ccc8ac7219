//! A plain [`Shell`] for the core's unit tests and the simulator: records are values,
//! permits a counter. Nothing of rdkafka or tokio.

use std::cell::Cell;
use std::rc::Rc;

use super::shell::{Record, Shell};

/// The test shell.
#[derive(Debug)]
pub(crate) struct TestShell;

/// A trigger: its free permits.
#[derive(Clone, Debug)]
pub(crate) struct TestTrigger {
    free: Rc<Cell<usize>>,
}

impl TestTrigger {
    /// A trigger with `permits` permits.
    pub(crate) fn new(permits: usize) -> Self {
        Self {
            free: Rc::new(Cell::new(permits)),
        }
    }
}

/// A permit: given back when dropped.
#[derive(Debug)]
pub(crate) struct TestPermit(Rc<Cell<usize>>);

impl Drop for TestPermit {
    fn drop(&mut self) {
        self.0.set(self.0.get() + 1);
    }
}

/// A record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TestRecord {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload_len: usize,
    /// The simulator's tag: which incarnation of its topic the record was read from.
    pub(crate) incarnation: u64,
}

impl Record for TestRecord {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn partition(&self) -> i32 {
        self.partition
    }
    fn offset(&self) -> i64 {
        self.offset
    }
    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    fn payload_len(&self) -> usize {
        self.payload_len
    }
}

impl Shell for TestShell {
    type Trigger = TestTrigger;
    type Permit = TestPermit;
    type Record = TestRecord;

    fn try_permit(trigger: &TestTrigger) -> Option<TestPermit> {
        let free = trigger.free.get();
        (free > 0).then(|| {
            trigger.free.set(free - 1);
            TestPermit(Rc::clone(&trigger.free))
        })
    }
}

/// A record of topic "t" with a key and a value of `payload_len` bytes.
pub(crate) fn record(partition: i32, offset: i64, key: &[u8], payload_len: usize) -> TestRecord {
    TestRecord {
        topic: "t".into(),
        partition,
        offset,
        key: Some(key.to_vec()),
        payload_len,
        incarnation: 0,
    }
}
