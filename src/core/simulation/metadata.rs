//! Commit metadata as a new owner may find it: the group's last commit's, or, when a
//! schedule draws metadata faults, what another writer left there (anyone with WRITE on the
//! group can commit): another tool's, a newer version's, one for another offset, text cut
//! short, text that was not UTF-8 (a lossy conversion's replacement characters), the same
//! map in the older `tk1` or `tk2` forms (a rolling upgrade), or a `tk3` text naming another
//! topic id (a commit made under an older topic of the same name) or a malformed one.

use super::schedule::Rng;
use crate::core::offsets::parse_metadata;

/// What a new owner is handed instead of `metadata` (committed with `offset`), and whether
/// it still names what `metadata` does (only the `tk1` and `tk2` forms do; with anything else
/// the records the map named may run again). The other topic id is [`OLDER_TOPIC_ID`].
pub(super) fn disguise(rng: &mut Rng, offset: i64, metadata: &str) -> (String, &'static str, bool) {
    if !metadata.is_ascii() {
        return (metadata.to_owned(), "metadata: kept", true);
    }
    match rng.below(10) {
        0 => (older_form(offset, metadata), "metadata: the tk1 form", true),
        1 => {
            let foreign = [
                // Kafka Streams (magic 2, partition time), Parallel Consumer (magic byte).
                "AgAAAYvHN2Nf",
                "bgAKAAUA",
                "{\"offset\":5}",
                "tk",
            ];
            let pick = foreign[rng.below(foreign.len() as u64) as usize];
            (pick.to_owned(), "metadata: foreign", false)
        }
        2 => {
            let cut = rng.below(metadata.len() as u64 + 1) as usize;
            (metadata[..cut].to_owned(), "metadata: cut short", false)
        }
        3 => {
            // A byte that was not UTF-8, replaced as a lossy conversion does.
            let at = rng.below(metadata.len() as u64) as usize;
            let mut text = metadata[..at].to_owned();
            text.push('\u{FFFD}');
            text.push_str(&metadata[at..]);
            (text, "metadata: not UTF-8", false)
        }
        4 => (
            format!("tk9:{}", without_form(metadata)),
            "metadata: another form",
            false,
        ),
        7 => (
            format!("tk2:{}", without_form(metadata)),
            "metadata: the tk2 form",
            true,
        ),
        8 => (
            format!("tk3:{OLDER_TOPIC_ID}:{}", without_form(metadata)),
            "metadata: an older topic's id",
            false,
        ),
        9 => (
            format!("tk3:an id:{}", without_form(metadata)),
            "metadata: a malformed topic id",
            false,
        ),
        5 => {
            let other = metadata.replacen(&format!(":{offset}:"), &format!(":{}:", offset + 1), 1);
            (other, "metadata: another offset", false)
        }
        _ => {
            // Long enough to be refused unread.
            let long = "A".repeat(crate::core::offset_codec::MAX_METADATA_CHARS + 1);
            (format!("tk2:{offset}:b{long}"), "metadata: too long", false)
        }
    }
}

/// A topic id no incarnation of the simulated topic has (theirs are `id-<n>`).
pub(super) const OLDER_TOPIC_ID: &str = "an-older-topic";

/// `<base>:<body>` of a `tk2` or `tk3` text (the connector writes no other).
fn without_form(metadata: &str) -> &str {
    if let Some(rest) = metadata.strip_prefix("tk3:") {
        return rest.split_once(':').map_or(rest, |(_, r)| r);
    }
    metadata.strip_prefix("tk2:").unwrap_or(metadata)
}

/// `metadata`'s map in the `tk1` form: deltas from the offset, ranges of consecutive ones.
fn older_form(offset: i64, metadata: &str) -> String {
    let items: Vec<String> = parse_metadata(offset, metadata)
        .ranges()
        .iter()
        .map(|&(s, e)| match e - s {
            1 => format!("{}", s - offset),
            _ => format!("{}-{}", s - offset, e - 1 - offset),
        })
        .collect();
    format!("tk1:{offset}:{}", items.join(","))
}
