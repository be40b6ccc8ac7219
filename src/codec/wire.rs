//! Confluent wire format framing: magic byte 0, a 4-byte big-endian schema id, then (for
//! Protobuf) the message-index array, then the payload. Pure: no I/O, every read length-checked.

use thiserror::Error;

/// The magic byte of the Confluent framing.
pub const MAGIC_BYTE: u8 = 0;

/// Why bytes are not a valid Confluent frame.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// Fewer than the 5 header bytes.
    #[error("payload of {len} bytes is shorter than the 5-byte schema registry header")]
    Truncated {
        /// Length seen.
        len: usize,
    },
    /// First byte is not 0.
    #[error("unknown magic byte {0:#04x}; expected 0x00 (Confluent schema registry framing)")]
    BadMagic(u8),
    /// Schema id is 0 or negative as a signed 32-bit integer.
    #[error("invalid schema id {0}")]
    InvalidSchemaId(i32),
    /// The Protobuf message-index array is malformed.
    #[error("malformed protobuf message index array: {0}")]
    BadMessageIndexes(&'static str),
}

/// A parsed frame header, borrowing the rest of the payload.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The registry's schema id.
    pub schema_id: u32,
    /// Everything after the 5-byte header.
    pub body: &'a [u8],
}

/// True when `bytes` start like a Confluent frame (used by the `auto` format).
pub fn looks_framed(bytes: &[u8]) -> bool {
    parse_frame(bytes).is_ok()
}

/// Parses the 5-byte header.
pub fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>, WireError> {
    let Some((header, body)) = bytes.split_first_chunk::<5>() else {
        return Err(WireError::Truncated { len: bytes.len() });
    };
    if header[0] != MAGIC_BYTE {
        return Err(WireError::BadMagic(header[0]));
    }
    let id = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    if id <= 0 {
        return Err(WireError::InvalidSchemaId(id));
    }
    Ok(Frame {
        schema_id: id as u32,
        body,
    })
}

/// Most nesting levels accepted in a message-index array.
const MAX_INDEXES: i64 = 64;

/// Reads the Protobuf message-index array (zig-zag varints: a count, then that many indexes;
/// a lone 0 means `[0]`). Returns the path and the rest of the payload.
pub fn read_message_indexes(body: &[u8]) -> Result<(Vec<usize>, &[u8]), WireError> {
    let (count, mut rest) = read_zigzag_varint(body)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if !(1..=MAX_INDEXES).contains(&count) {
        return Err(WireError::BadMessageIndexes("count out of range"));
    }
    let mut path = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (index, r) = read_zigzag_varint(rest)?;
        if index < 0 || index > i64::from(i32::MAX) {
            return Err(WireError::BadMessageIndexes("negative or huge index"));
        }
        path.push(index as usize);
        rest = r;
    }
    Ok((path, rest))
}

/// Encodes a message-index array the way the reference serializers do.
pub fn write_message_indexes(path: &[usize], out: &mut Vec<u8>) {
    if path == [0] {
        out.push(0);
        return;
    }
    write_zigzag_varint(path.len() as i64, out);
    for &i in path {
        write_zigzag_varint(i as i64, out);
    }
}

fn read_zigzag_varint(bytes: &[u8]) -> Result<(i64, &[u8]), WireError> {
    let mut value: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let decoded = ((value >> 1) as i64) ^ -((value & 1) as i64);
            return Ok((decoded, &bytes[i + 1..]));
        }
    }
    Err(WireError::BadMessageIndexes("truncated or overlong varint"))
}

fn write_zigzag_varint(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_header() {
        let f = parse_frame(&[0, 0, 0, 1, 2, 9, 9]).unwrap();
        assert_eq!(f.schema_id, 258);
        assert_eq!(f.body, &[9, 9]);
    }

    #[test]
    fn rejects_short_bad_magic_and_bad_ids() {
        assert_eq!(
            parse_frame(&[0, 0, 0]),
            Err(WireError::Truncated { len: 3 })
        );
        assert_eq!(parse_frame(&[1, 0, 0, 0, 1]), Err(WireError::BadMagic(1)));
        assert_eq!(
            parse_frame(&[0, 0, 0, 0, 0]),
            Err(WireError::InvalidSchemaId(0))
        );
        assert_eq!(
            parse_frame(&[0, 0xff, 0xff, 0xff, 0xff]),
            Err(WireError::InvalidSchemaId(-1))
        );
    }

    #[test]
    fn message_indexes_match_reference_encoding() {
        // [0] is a single zero byte; [1] is count 1 (0x02) then index 1 (0x02).
        assert_eq!(
            read_message_indexes(&[0, 7]).unwrap(),
            (vec![0], &[7u8][..])
        );
        assert_eq!(
            read_message_indexes(&[2, 2, 7]).unwrap(),
            (vec![1], &[7u8][..])
        );
        assert_eq!(read_message_indexes(&[4, 2, 4]).unwrap().0, vec![1, 2]);
        for path in [vec![0], vec![1], vec![3, 0, 2], vec![200]] {
            let mut buf = Vec::new();
            write_message_indexes(&path, &mut buf);
            assert_eq!(read_message_indexes(&buf).unwrap().0, path);
        }
    }

    #[test]
    fn rejects_bad_index_arrays() {
        assert!(read_message_indexes(&[]).is_err());
        assert!(read_message_indexes(&[1]).is_err()); // count -1
        assert!(read_message_indexes(&[4, 2]).is_err()); // count 2, one index
        assert!(read_message_indexes(&[2, 1]).is_err()); // index -1
        assert!(read_message_indexes(&[0xff; 12]).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(frame) = parse_frame(&bytes) {
                let _ = read_message_indexes(frame.body);
            }
            let _ = read_message_indexes(&bytes);
        }
    }
}
