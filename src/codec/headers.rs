//! Record headers read as bytes.
//!
//! Kafka does not check header names: any bytes can be one (`kcat -H $'\xff\xfe=v'` writes
//! such a name). rust-rdkafka's [`Headers`](rdkafka::message::Headers) API turns each name
//! into a `&str` and panics on one that is not UTF-8, so a single hostile record would panic
//! every run (and every later owner's) that reads it. Here names and values are read through
//! librdkafka's own accessor, as bytes; the rest of the connector never calls the panicking
//! API on a consumed record.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};

use rdkafka::bindings::{rd_kafka_header_cnt, rd_kafka_header_get_all, rd_kafka_headers_t};
use rdkafka::message::{BorrowedHeaders, Message as _, OwnedMessage};
use rdkafka::types::RDKafkaRespErr;

/// One header of a record: its name and value as librdkafka holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader<'a> {
    /// The name's bytes (librdkafka stores names NUL-terminated, so they hold no NUL).
    pub name: &'a [u8],
    /// The value's bytes; `None` for a header without a value (null, not empty).
    pub value: Option<&'a [u8]>,
}

/// The headers of `msg`, in order, duplicates kept.
pub fn raw_headers(msg: &OwnedMessage) -> impl Iterator<Item = RawHeader<'_>> {
    let headers = msg.headers().map(|h| h.as_borrowed());
    let count = headers.map_or(0, count);
    (0..count).filter_map(move |i| headers.and_then(|h| get(h, i)))
}

/// The native list behind `h`. rust-rdkafka hands out `&BorrowedHeaders` as the address of
/// librdkafka's `rd_kafka_headers_t` itself (it is a unit type reached through a pointer
/// cast), which is what its own accessors pass back to librdkafka.
fn native(h: &BorrowedHeaders) -> *const rd_kafka_headers_t {
    std::ptr::from_ref(h).cast()
}

fn count(h: &BorrowedHeaders) -> usize {
    // SAFETY: `native(h)` is a live header list owned by the message `h` borrows from.
    unsafe { rd_kafka_header_cnt(native(h)) }
}

fn get(h: &BorrowedHeaders, idx: usize) -> Option<RawHeader<'_>> {
    let mut name: *const c_char = std::ptr::null();
    let mut value: *const c_void = std::ptr::null();
    let mut size: usize = 0;
    // SAFETY: as in `count`; the out-pointers are valid locals. On success librdkafka points
    // them into the header list, which lives as long as `h`.
    let err = unsafe { rd_kafka_header_get_all(native(h), idx, &mut name, &mut value, &mut size) };
    if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
        return None;
    }
    // SAFETY: librdkafka stores each name NUL-terminated, and it outlives `h`'s borrow.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    let value = if value.is_null() {
        None
    } else if size == 0 {
        Some(&[][..])
    } else {
        // SAFETY: librdkafka says the value is `size` bytes at `value`, owned by the list.
        Some(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) })
    };
    Some(RawHeader { name, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::Timestamp;

    fn with_headers(headers: Option<OwnedHeaders>) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            headers,
        )
    }

    #[test]
    fn names_and_values_are_read_in_order_with_duplicates_and_nulls() {
        let h = OwnedHeaders::new()
            .insert(Header {
                key: "a",
                value: Some(b"1".as_slice()),
            })
            .insert(Header {
                key: "b",
                value: None::<&[u8]>,
            })
            .insert(Header {
                key: "a",
                value: Some(b"".as_slice()),
            })
            .insert(Header {
                key: "bin",
                value: Some([0xff, 0x00, 0xfe].as_slice()),
            });
        let msg = with_headers(Some(h));
        let got: Vec<RawHeader<'_>> = raw_headers(&msg).collect();
        assert_eq!(
            got,
            vec![
                RawHeader {
                    name: b"a",
                    value: Some(b"1")
                },
                RawHeader {
                    name: b"b",
                    value: None
                },
                RawHeader {
                    name: b"a",
                    value: Some(b"")
                },
                RawHeader {
                    name: b"bin",
                    value: Some(&[0xff, 0x00, 0xfe])
                },
            ]
        );
        assert_eq!(raw_headers(&with_headers(None)).count(), 0);
        assert_eq!(
            raw_headers(&with_headers(Some(OwnedHeaders::new()))).count(),
            0
        );
    }
}
