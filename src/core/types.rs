//! The core's own small types, which the rest of the crate imports from here (`dispatch`,
//! `config` re-export them): the core depends on nothing of the shell's.

use serde::{Deserialize, Serialize};

/// A topic and partition.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// Topic name.
    pub topic: String,
    /// Partition number.
    pub partition: i32,
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// Ordering guarantee of a trigger.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Per key within a partition. Messages without a key are ordered among themselves.
    #[default]
    Key,
    /// Strictly per partition.
    Partition,
    /// No ordering.
    Unordered,
}
