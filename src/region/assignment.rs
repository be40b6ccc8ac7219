//! A member's assignment as the classic consumer protocol writes it in the group's
//! description (`ConsumerProtocolAssignment`, versions 0 to 3, none flexible): a version
//! (int16), then an array (int32 count) of topics, each a string (int16 length) and an array
//! of partitions (int32 each), then user data (ignored).

use std::collections::BTreeMap;

/// The partitions of each topic in `bytes`; None when they are not a consumer protocol
/// assignment.
pub(super) fn parse(bytes: &[u8]) -> Option<BTreeMap<String, Vec<i32>>> {
    let mut r = Reader(bytes);
    let _version = r.i16()?;
    let topics = r.i32()?;
    let mut out = BTreeMap::new();
    for _ in 0..topics.max(0) {
        let len = usize::try_from(r.i16()?).ok()?;
        let topic = std::str::from_utf8(r.take(len)?).ok()?.to_owned();
        let count = r.i32()?;
        let mut partitions = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(10_000));
        for _ in 0..count.max(0) {
            partitions.push(r.i32()?);
        }
        out.entry(topic).or_insert_with(Vec::new).extend(partitions);
    }
    Some(out)
}

/// Big-endian reads off the front of a slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        self.take(2)
            .map(|b| i16::from_be_bytes(b.try_into().unwrap_or_default()))
    }

    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_be_bytes(b.try_into().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(version: i16, topics: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        // User data: null.
        b.extend((-1i32).to_be_bytes());
        b
    }

    #[test]
    fn reads_the_partitions_of_each_topic() {
        let bytes = encode(3, &[("tessel-region-eu", &[0, 7, 59]), ("other", &[])]);
        let parsed = parse(&bytes).unwrap();
        assert_eq!(parsed["tessel-region-eu"], [0, 7, 59]);
        assert!(parsed["other"].is_empty());
        assert_eq!(parse(&encode(0, &[])).unwrap(), BTreeMap::new());
    }

    #[test]
    fn what_is_not_an_assignment_is_refused() {
        let bytes = encode(1, &[("t", &[1, 2])]);
        assert!(parse(&bytes[..bytes.len() - 9]).is_none(), "cut short");
        assert!(parse(&[0]).is_none());
        assert!(parse(&[]).is_none());
    }
}
