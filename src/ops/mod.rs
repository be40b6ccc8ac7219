//! Operator tools: `tessel-kafka check` (reach, authentication and permissions of each
//! connection), committed offsets and lag, offset resets, and dead-letter replay.

pub mod check;
pub mod replay;
pub mod tools;
