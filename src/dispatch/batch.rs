//! Batch requests, the pure part: a batch's idempotency key, which records of a partly failed
//! batch are sent again, and how a rejected batch is bisected. Shared by a trigger's runs
//! and `dlq replay` (`ops::replay`), which build requests through `run::body` and read
//! answers through `run::plan`.

use std::collections::HashSet;

use crate::core::shell::Record;

/// The idempotency key of a batch: the partition, its first and last offsets, and how many
/// records it holds (a retried part of a batch can have the first and last offsets of the
/// whole, never its count).
pub fn idempotency_key(
    group: &str,
    topic: &str,
    partition: i32,
    first: i64,
    last: i64,
    count: usize,
) -> String {
    format!("kafka:{group}:{topic}:{partition}:{first}-{last}:{count}")
}

/// The key of a batch request of `count` records of `topic`/`partition` from `first` to
/// `last` ([`idempotency_key`]), or, resent after a 409, its [`conflict_key`] with `nonce`.
pub fn request_key(
    group: &str,
    topic_id: Option<&str>,
    first: &impl Record,
    last: &impl Record,
    count: usize,
    conflict_nonce: Option<u64>,
) -> String {
    let (topic, partition) = (first.topic(), first.partition());
    let key = idempotency_key(
        group,
        &crate::dispatch::event::key_topic(topic, topic_id),
        partition,
        first.offset(),
        last.offset(),
        count,
    );
    match conflict_nonce {
        Some(nonce) => conflict_key(&key, nonce),
        None => key,
    }
}

/// The key a batch is sent again under after a 409 to `key`: `key` with a random suffix,
/// so that the dispatcher answers for this request's events rather than recall an earlier
/// request with the same bounds (whose answer may have named events failed).
pub fn conflict_key(key: &str, nonce: u64) -> String {
    format!("{key}:r{nonce:016x}")
}

/// After a 2xx answer naming `failed` event ids: which records (indices into `records`, each
/// an id and a key, in offset order) are sent again. Those named, and every later record of
/// their keys (so a key's records keep their order); the others are accepted. Ids the batch
/// does not hold are ignored.
pub fn to_retry<K: Eq + std::hash::Hash>(records: &[(&str, K)], failed: &[String]) -> Vec<usize> {
    if failed.is_empty() {
        return Vec::new();
    }
    let failed: HashSet<&str> = failed.iter().map(String::as_str).collect();
    let mut parked: HashSet<&K> = HashSet::new();
    let mut out = Vec::new();
    for (i, (id, key)) in records.iter().enumerate() {
        if failed.contains(id) || parked.contains(key) {
            let _ = parked.insert(key);
            out.push(i);
        }
    }
    out
}

/// The dispatcher's partial-failure answer: `{"failed": ["<event id>", …]}`. Any other 2xx
/// body (empty, not JSON, without `failed`) accepts the whole batch. Err when the answer
/// speaks of `failed` and cannot be read as that list (a wrong type, cut-off JSON): then no
/// event of the batch counts as accepted.
pub fn failed_ids(body: &[u8]) -> Result<Vec<String>, String> {
    // Any 2xx body is an acceptance unless it is a JSON object with a `failed` member; that
    // member must then be a list of event ids, or nothing of the batch counts as accepted.
    let mut answer = match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(answer)) => answer,
        Ok(_) => return Ok(Vec::new()),
        Err(e) if body.windows(8).any(|w| w == b"\"failed\"") => {
            return Err(format!("the answer names `failed` but is not JSON: {e}"))
        }
        Err(_) => return Ok(Vec::new()),
    };
    match answer.remove("failed") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(ids)) => ids
            .into_iter()
            .map(|id| match id {
                serde_json::Value::String(id) => Ok(id),
                other => Err(format!("`failed` holds {other}, not an event id")),
            })
            .collect(),
        Some(other) => Err(format!("`failed` is {other}, not a list of event ids")),
    }
}

/// Splits a rejected batch (a list of record indices) in two halves, the earlier offsets
/// first; None for a single record, which is the offending one.
pub fn bisect(records: &[usize]) -> Option<(Vec<usize>, Vec<usize>)> {
    if records.len() < 2 {
        return None;
    }
    let mid = records.len() / 2;
    Some((records[..mid].to_vec(), records[mid..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_keys_differ_for_every_part_of_a_batch() {
        let whole = idempotency_key("g", "t", 0, 3, 7, 3);
        let part = idempotency_key("g", "t", 0, 3, 7, 2);
        assert_eq!(whole, "kafka:g:t:0:3-7:3");
        assert_ne!(whole, part);
    }

    #[test]
    fn a_partial_failure_retries_the_failed_records_and_later_ones_of_their_keys() {
        let records = [
            ("a0", "a"),
            ("b1", "b"),
            ("a2", "a"),
            ("c3", "c"),
            ("b4", "b"),
            ("c5", "c"),
        ];
        // b1 failed: b4 waits for it. c5 failed alone. a is accepted.
        let failed = vec!["b1".to_owned(), "c5".to_owned(), "unknown".to_owned()];
        assert_eq!(to_retry(&records, &failed), vec![1, 4, 5]);
        assert!(to_retry(&records, &[]).is_empty());
        // A failed record's earlier records of its key are accepted.
        assert_eq!(to_retry(&records, &["a2".to_owned()]), vec![2]);
    }

    #[test]
    fn only_a_failed_list_is_a_partial_failure() {
        assert_eq!(
            failed_ids(br#"{"failed": ["x", "y"]}"#).unwrap(),
            vec!["x", "y"]
        );
        for accepted in [
            &br#"{"failed": []}"#[..],
            br#"{"failed": null}"#,
            b"",
            br#"{"run": "r1"}"#,
            b"accepted",
            b"[1, 2]",
        ] {
            assert_eq!(failed_ids(accepted), Ok(Vec::new()), "{accepted:?}");
        }
        // Hostile or broken partial-failure answers never pass for an acceptance.
        for unreadable in [
            &br#"{"failed": "x"}"#[..],
            br#"{"failed": ["x", 7]}"#,
            br#"{"failed": {"x": 1}}"#,
            br#"{"failed": ["x", "y""#,
            br#"{"failed": ["x"], "#,
        ] {
            assert!(failed_ids(unreadable).is_err(), "{unreadable:?}");
        }
    }

    #[test]
    fn bisection_isolates_one_record_in_log_steps() {
        let all: Vec<usize> = (0..500).collect();
        let poison = 377;
        // Follow the half holding the poison record, as the worker does with 4xx answers.
        let mut batch = all;
        let mut requests = 1;
        while let Some((first, second)) = bisect(&batch) {
            assert_eq!(first.len() + second.len(), batch.len());
            assert!(first.last() < second.first(), "earlier offsets first");
            batch = if first.contains(&poison) {
                first
            } else {
                second
            };
            requests += 1;
        }
        assert_eq!(batch, vec![poison]);
        assert!(requests <= 10, "{requests}");
        assert!(bisect(&[4]).is_none());
    }
}
