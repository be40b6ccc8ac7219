//! The commit metadata's text: which offsets above a partition's commit offset are handled.
//!
//! A partition's handled offsets above its commit offset (the *base*) are described as runs,
//! alternately not handled and handled, starting at the base (which is never handled: it is
//! the record the commit waits on). Offsets the consumer never returned (transaction markers,
//! aborted records, offsets compaction removed) may sit in either kind of run, whichever
//! keeps the runs long, so a topic with one record per transaction costs no more than one
//! without markers.
//!
//! Two encodings of the same runs, and the smaller is written:
//!
//! - `r`, run length: each run's length as an unsigned LEB128 varint, the first a run not
//!   handled, the last a handled one. Small when the map has few runs, however far it spans.
//! - `b`, bit set: one bit per offset from the base + 1 on (least significant bit first, 1 =
//!   handled). Small when runs are short and many: a span of `n` offsets is `n / 8` bytes
//!   whatever its shape.
//!
//! The text is `tk2:<base>:<r|b><bytes in URL-safe Base64, unpadded>`, ASCII only, so its
//! length in bytes is its length in UTF-16 units, which is what the broker checks against
//! `offset.metadata.max.bytes` (docs/architecture.md). Compression is not used: the
//! partition's start gate needs an upper bound of the text's length for every map its runs in
//! flight can lead to, known from counts alone ([`max_len`]); a compressor's output has none,
//! and the bit set already bounds any shape at one bit an offset.
//!
//! Where the partition's topic id (KIP-516) is known, the text also names it:
//! `tk3:<topic id>:<base>:[<r|b><bytes>]`, the body empty when nothing above the base is
//! handled (the text is written even then, for the id). The id is written as the cluster's
//! text of it, which is already compact and canonical: Kafka prints a topic id as the URL-safe
//! Base64 of its 16 bytes, unpadded, 22 characters (`consumer::native`, as librdkafka's
//! bytes are turned into text); any token of 1 to [`MAX_TOPIC_ID_CHARS`] characters of that
//! alphabet is accepted, and ids are compared as text. Kafka keeps a group's offsets by topic
//! name, so a commit decided for a topic's old log can land on a topic created again under
//! the same name; the id tells the next owner that the commit is the old topic's, and it reads
//! the new one from where `auto.offset.reset` says (`core::partitions`). An id that is not such
//! a token (none is expected) is not written: the text is `tk2`, as with no id. The id costs
//! [`topic_id_len`] characters more; when the whole map does not fit the budget with it, the
//! id is left out rather than the map cut (the start gate counts the id, so this happens only
//! when the id became known after runs started under a bound without it).
//!
//! The previous forms are still read, so a rolling upgrade keeps the old owner's map: `tk2`
//! (the same map, no id) and `tk1:<base>:<d>[-<d>],…` (deltas from the base, ranges of
//! consecutive offsets).
//!
//! Reading is defensive: metadata is whatever the group's last committer wrote (another
//! tool, another version, anyone with WRITE on the group). Text that is not a well-formed map
//! of this base is refused whole ([`MetadataError`]); a well-formed map keeps at most
//! [`MAX_METADATA_OFFSETS`] offsets above its base. Refusing or cutting is always safe: an
//! offset not known as handled is dispatched again, under the same idempotency key. Pure and
//! exhaustively tested, with a fuzz target (`tests/fuzz`, `commit_metadata`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// The prefix of the form that names no topic id (written where the cluster has none).
pub const PREFIX: &str = "tk2:";

/// The prefix of the form that names the topic's id.
pub const ID_PREFIX: &str = "tk3:";

/// The longest topic id written or read, in characters: Kafka's text of a topic id (the
/// URL-safe Base64 of 16 bytes, unpadded) is 22.
pub const MAX_TOPIC_ID_CHARS: usize = 22;

/// The prefix of the first form, still read.
pub const LEGACY_PREFIX: &str = "tk1:";

/// The longest metadata read or written, in characters (the largest
/// `commit_metadata_max_bytes` a connection may set). Longer text is refused unread.
pub const MAX_METADATA_CHARS: usize = 8192;

/// The most offsets above its base a map may name. A map read keeps those below
/// `base + 1 + MAX_METADATA_OFFSETS`; a partition whose gap spans more stops starting runs
/// above it, so its own maps are always read whole. 2^20 covers 10,000 records at one in a
/// hundred offsets (a heavily compacted topic); it also bounds what a hostile map can make a
/// new owner skip.
pub const MAX_METADATA_OFFSETS: i64 = 1 << 20;

/// Why commit metadata was not read as a map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// Not written by tessel-kafka (another consumer's or tool's metadata).
    #[error("not tessel-kafka's commit metadata")]
    Foreign,
    /// A form this version does not know (a newer version wrote it).
    #[error("commit metadata of an unknown form {0:?}")]
    UnknownForm(String),
    /// Written for another commit offset (the offset was moved without its metadata).
    #[error("commit metadata written for another offset")]
    OtherOffset,
    /// Longer than [`MAX_METADATA_CHARS`].
    #[error("commit metadata of {0} characters, more than {MAX_METADATA_CHARS}")]
    TooLong(usize),
    /// Not a well-formed map.
    #[error("malformed commit metadata: {0}")]
    Malformed(&'static str),
}

/// Handled offsets: ascending, disjoint, non-adjacent half-open ranges `[start, end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandledRanges(Vec<(i64, i64)>);

impl HandledRanges {
    /// The ranges, ascending.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.0
    }

    /// Whether no offset is named.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many offsets are named.
    pub fn len(&self) -> usize {
        self.0.iter().map(|(s, e)| (e - s) as usize).sum()
    }

    /// Whether `offset` is named (binary search).
    pub fn contains(&self, offset: i64) -> bool {
        let i = self.0.partition_point(|(_, e)| *e <= offset);
        self.0.get(i).is_some_and(|(s, _)| *s <= offset)
    }

    /// The offsets named, ascending.
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        self.0.iter().flat_map(|(s, e)| *s..*e)
    }

    /// The ranges, to keep.
    pub fn into_ranges(self) -> Vec<(i64, i64)> {
        self.0
    }

    /// Appends `[start, end)` above every range so far, merging an adjacent one; keeps
    /// offsets below `limit` only.
    fn push(&mut self, start: i64, end: i64, limit: i64) {
        let end = end.min(limit);
        if start >= end {
            return;
        }
        match self.0.last_mut() {
            Some((_, e)) if *e == start => *e = end,
            _ => self.0.push((start, end)),
        }
    }
}

/// The text of the map whose runs are `runs` (alternately not handled and handled, from
/// `base` on, the first not handled and the last handled, none empty), at most `max_chars`
/// long. Returns it and whether it had to be cut to fit: a cut map leaves out the highest
/// handled offsets (the next owner runs them again), never names one not handled.
pub fn encode(base: i64, runs: &[u64], max_chars: usize) -> (String, bool) {
    encode_with_id(None, base, runs, max_chars)
}

/// [`encode`], naming `topic_id` (the `tk3` form) when it is a valid id and the whole map
/// fits `max_chars` with it; otherwise the `tk2` form, as [`encode`] writes it.
pub fn encode_with_id(
    topic_id: Option<&str>,
    base: i64,
    runs: &[u64],
    max_chars: usize,
) -> (String, bool) {
    debug_assert!(runs.len().is_multiple_of(2) && runs.iter().all(|r| *r > 0));
    if let Some(id) = topic_id.filter(|id| valid_topic_id(id)) {
        let payload = if runs.len() < 2 {
            0
        } else {
            let span: u64 = runs.iter().sum();
            let rle: usize = runs.iter().map(|r| varint_len(*r)).sum();
            // The letter and the payload.
            1 + base64_len(rle.min(bitset_len(span)))
        };
        if ID_PREFIX.len() + id.len() + 1 + decimal_len(base) + 1 + payload <= max_chars {
            // Shorter than the `tk3` text: whole.
            let (body, _) = encode_body(base, runs, max_chars);
            let mut text = String::with_capacity(ID_PREFIX.len() + id.len() + 2 + body.len());
            text.push_str(ID_PREFIX);
            text.push_str(id);
            text.push(':');
            if body.is_empty() {
                text.push_str(&base.to_string());
                text.push(':');
            } else {
                // `<base>:<r|b>…` of the `tk2` text.
                text.push_str(&body[PREFIX.len()..]);
            }
            debug_assert!(text.len() <= max_chars);
            return (text, false);
        }
    }
    encode_body(base, runs, max_chars)
}

/// The `tk2` text of the map.
fn encode_body(base: i64, runs: &[u64], max_chars: usize) -> (String, bool) {
    if runs.len() < 2 {
        return (String::new(), false);
    }
    let span: u64 = runs.iter().sum();
    let rle: usize = runs.iter().map(|r| varint_len(*r)).sum();
    let bits = bitset_len(span);
    let header = header_len(base);
    let room = max_chars.saturating_sub(header);
    // The most payload bytes whose Base64 fits the room.
    let room_bytes = room * 3 / 4;
    let cut = rle.min(bits) > room_bytes;
    let (kind, bytes) = if rle <= bits {
        ('r', rle_bytes(runs, if cut { room_bytes } else { rle }))
    } else {
        ('b', bitset_bytes(runs, if cut { room_bytes } else { bits }))
    };
    if bytes.is_empty() {
        return (String::new(), true);
    }
    let mut text = String::with_capacity(header + base64_len(bytes.len()));
    text.push_str(PREFIX);
    text.push_str(&base.to_string());
    text.push(':');
    text.push(kind);
    URL_SAFE_NO_PAD.encode_string(&bytes, &mut text);
    debug_assert!(text.len() <= max_chars || max_chars < header);
    (text, cut)
}

/// The longest text any map can have whose base is below `top`, with at most `runs` runs
/// (`None`: any number) over at most `span` offsets from its base, written naming a topic id
/// of `id_len` characters ([`topic_id_len`]; 0 for none). What a partition's start gate
/// compares with its budget: O(1).
pub fn max_len(top: i64, id_len: usize, runs: Option<usize>, span: u64) -> usize {
    let bits = bitset_len(span);
    let payload = match runs {
        Some(runs) => bits.min(rle_bound(runs as u64, span)),
        None => bits,
    };
    header_len(top) + id_len + base64_len(payload)
}

/// What naming `topic_id` adds to a text's length (`tk3:<id>:` for `tk2:`): 0 for no id, or
/// one that is not written.
pub fn topic_id_len(topic_id: Option<&str>) -> usize {
    match topic_id {
        Some(id) if valid_topic_id(id) => id.len() + 1,
        _ => 0,
    }
}

/// Whether `id` is a topic id the text can name: 1 to [`MAX_TOPIC_ID_CHARS`] characters of
/// the URL-safe Base64 alphabet.
pub fn valid_topic_id(id: &str) -> bool {
    (1..=MAX_TOPIC_ID_CHARS).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// An upper bound of the run-length bytes of `runs` runs summing to at most `span`: a
/// varint of `x` takes at most `1 + log2(x) / 7` bytes, and by the concavity of the
/// logarithm the sum is largest when the runs are equal.
fn rle_bound(runs: u64, span: u64) -> usize {
    let runs = runs.min(span);
    if runs == 0 {
        return 0;
    }
    let mean = span.div_ceil(runs);
    // ceil(log2(mean)): 0 for 1.
    let log = u64::from(64 - (mean - 1).leading_zeros());
    (runs + (runs * log).div_ceil(7)) as usize
}

/// `tk2:<base>:` and the encoding's letter.
fn header_len(base: i64) -> usize {
    PREFIX.len() + decimal_len(base) + 2
}

fn decimal_len(n: i64) -> usize {
    if n <= 0 {
        return n.to_string().len();
    }
    (n.ilog10() + 1) as usize
}

/// Unpadded Base64 length of `n` bytes.
fn base64_len(n: usize) -> usize {
    (n * 4).div_ceil(3)
}

/// Bytes of the bit set over `span` offsets from the base (the base itself needs no bit).
fn bitset_len(span: u64) -> usize {
    span.saturating_sub(1).div_ceil(8) as usize
}

fn varint_len(x: u64) -> usize {
    (64 - (x | 1).leading_zeros()).div_ceil(7) as usize
}

fn push_varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// The run-length bytes of `runs`, whole pairs (a run not handled and the handled one
/// after it) only, at most `max` bytes.
fn rle_bytes(runs: &[u64], max: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(max);
    for pair in runs.chunks_exact(2) {
        if out.len() + varint_len(pair[0]) + varint_len(pair[1]) > max {
            break;
        }
        push_varint(&mut out, pair[0]);
        push_varint(&mut out, pair[1]);
    }
    out
}

/// The bit set of `runs`, its first `max` bytes (offsets past them count as not handled).
fn bitset_bytes(runs: &[u64], max: usize) -> Vec<u8> {
    let span: u64 = runs.iter().sum();
    let len = bitset_len(span).min(max);
    let mut out = vec![0u8; len];
    let limit = len as u64 * 8;
    // Bit i is offset base + 1 + i.
    let mut at: u64 = 0;
    for (i, run) in runs.iter().enumerate() {
        if i % 2 == 1 {
            let (from, to) = (at - 1, (at - 1 + run).min(limit));
            for bit in from..to {
                out[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        at += run;
        if at > limit {
            break;
        }
    }
    // A cut bit set may end in zero bytes: drop them.
    while out.last() == Some(&0) {
        out.pop();
    }
    out
}

/// The handled offsets `metadata` names above `base`, if it was written for `base`. Empty
/// metadata names none.
pub fn decode(base: i64, metadata: &str) -> Result<HandledRanges, MetadataError> {
    decode_committed(base, metadata).map(|c| c.handled)
}

/// What a commit's metadata says: the handled offsets above its base, and the topic id it
/// was written under (`tk3`; None for the older forms and for empty metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed<'a> {
    /// The topic id the commit was made under, if the text names one.
    pub topic_id: Option<&'a str>,
    /// The handled offsets above the base.
    pub handled: HandledRanges,
}

/// [`decode`], with the topic id the text names. The id is read only from a text that is a
/// well-formed map of `base` (one written for another offset says nothing of this commit); a
/// malformed id refuses the text whole.
pub fn decode_committed(base: i64, metadata: &str) -> Result<Committed<'_>, MetadataError> {
    if metadata.is_empty() {
        return Ok(Committed::default());
    }
    if metadata.len() > MAX_METADATA_CHARS {
        return Err(MetadataError::TooLong(metadata.len()));
    }
    let (form, rest) = split_form(metadata)?;
    let (topic_id, rest) = if form == 3 {
        let (id, rest) = rest
            .split_once(':')
            .ok_or(MetadataError::Malformed("no topic id"))?;
        if !valid_topic_id(id) {
            return Err(MetadataError::Malformed("not a topic id"));
        }
        (Some(id), rest)
    } else {
        (None, rest)
    };
    let (written_for, body) = rest
        .split_once(':')
        .ok_or(MetadataError::Malformed("no offset"))?;
    if written_for != base.to_string() {
        return Err(MetadataError::OtherOffset);
    }
    // Offsets kept: base + 1 ..= base + MAX_METADATA_OFFSETS (saturating at i64::MAX, which no
    // offset reaches).
    let limit = base.saturating_add(1).saturating_add(MAX_METADATA_OFFSETS);
    let handled = match form {
        1 => decode_tk1(base, body, limit)?,
        // `tk3` writes an empty body for an empty map.
        3 if body.is_empty() => HandledRanges::default(),
        _ => decode_tk2(base, body, limit)?,
    };
    Ok(Committed { topic_id, handled })
}

/// The form number of `metadata` (1, 2 or 3) and what follows `tkN:`.
fn split_form(metadata: &str) -> Result<(u8, &str), MetadataError> {
    if let Some(rest) = metadata.strip_prefix(ID_PREFIX) {
        return Ok((3, rest));
    }
    if let Some(rest) = metadata.strip_prefix(PREFIX) {
        return Ok((2, rest));
    }
    if let Some(rest) = metadata.strip_prefix(LEGACY_PREFIX) {
        return Ok((1, rest));
    }
    // `tk<digits>:`: ours, of a form this version does not know.
    let other = metadata
        .strip_prefix("tk")
        .and_then(|r| r.split_once(':'))
        .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    match other {
        Some((n, _)) => Err(MetadataError::UnknownForm(format!("tk{n}"))),
        None => Err(MetadataError::Foreign),
    }
}

fn decode_tk2(base: i64, body: &str, limit: i64) -> Result<HandledRanges, MetadataError> {
    let mut chars = body.chars();
    let kind = chars
        .next()
        .ok_or(MetadataError::Malformed("no encoding"))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(chars.as_str())
        .map_err(|_| MetadataError::Malformed("not Base64"))?;
    if bytes.is_empty() {
        return Err(MetadataError::Malformed("no runs"));
    }
    let mut out = HandledRanges::default();
    match kind {
        'r' => {
            let mut at = base;
            let mut input = bytes.as_slice();
            let mut handled = false;
            while !input.is_empty() {
                let run = read_varint(&mut input)?;
                let run = i64::try_from(run)
                    .ok()
                    .filter(|r| *r > 0)
                    .ok_or(MetadataError::Malformed("a run out of range"))?;
                let end = at
                    .checked_add(run)
                    .ok_or(MetadataError::Malformed("past the last offset"))?;
                if handled {
                    out.push(at, end, limit);
                }
                at = end;
                handled = !handled;
            }
            if handled {
                return Err(MetadataError::Malformed("ends with a run not handled"));
            }
        }
        'b' => {
            'bytes: for (i, byte) in bytes.iter().enumerate() {
                for bit in 0..8 {
                    if byte & (1 << bit) != 0 {
                        // i < MAX_METADATA_CHARS: the sum is small.
                        let o = base
                            .checked_add(1 + (i as i64) * 8 + bit)
                            .ok_or(MetadataError::Malformed("past the last offset"))?;
                        // Offsets at the limit and past it are not kept (and `o + 1`
                        // below cannot overflow).
                        if o >= limit {
                            break 'bytes;
                        }
                        out.push(o, o + 1, limit);
                    }
                }
            }
        }
        _ => return Err(MetadataError::Malformed("unknown encoding")),
    }
    Ok(out)
}

/// An unsigned LEB128 varint of at most 64 bits, in its shortest form.
fn read_varint(input: &mut &[u8]) -> Result<u64, MetadataError> {
    let mut x: u64 = 0;
    for (i, byte) in input.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7F);
        if i == 9 && bits > 1 {
            return Err(MetadataError::Malformed("a varint past 64 bits"));
        }
        x |= bits << (7 * i);
        if byte & 0x80 == 0 {
            if *byte == 0 && i > 0 {
                return Err(MetadataError::Malformed(
                    "a varint not in its shortest form",
                ));
            }
            *input = &input[i + 1..];
            return Ok(x);
        }
    }
    Err(MetadataError::Malformed("a varint cut short"))
}

/// `tk1`: deltas from the base, ascending, each a number or a range `a-b`.
fn decode_tk1(base: i64, list: &str, limit: i64) -> Result<HandledRanges, MetadataError> {
    let mut out = HandledRanges::default();
    let mut last: i64 = 0;
    for item in list.split(',').filter(|i| !i.is_empty()) {
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) else {
            return Err(MetadataError::Malformed("not a number"));
        };
        if a <= last || b < a {
            return Err(MetadataError::Malformed("ranges not ascending"));
        }
        let start = base.checked_add(a);
        let end = base.checked_add(b).and_then(|e| e.checked_add(1));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(MetadataError::Malformed("past the last offset"));
        };
        out.push(start, end, limit);
        last = b;
    }
    Ok(out)
}

/// The runs of a set of handled offsets above `base` (for tests and tools): `handled` must
/// ascend and lie above `base`.
pub fn runs_of(base: i64, handled: impl IntoIterator<Item = (i64, i64)>) -> Vec<u64> {
    let mut runs = Vec::new();
    let mut at = base;
    for (s, e) in handled {
        if s > at {
            runs.push((s - at) as u64);
            runs.push((e - s) as u64);
        } else if let Some(last) = runs.last_mut() {
            *last += (e - s) as u64;
        }
        at = e;
    }
    runs
}

#[cfg(test)]
#[path = "offset_codec_tests.rs"]
mod tests;
