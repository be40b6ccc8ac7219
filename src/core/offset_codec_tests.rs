use proptest::prelude::*;

use super::*;

/// Handled ranges above `base` from (gap, length) pairs: each gap of offsets not handled,
/// then a run of handled ones.
fn ranges(base: i64, pairs: &[(u32, u32)]) -> Vec<(i64, i64)> {
    let mut at = base + 1;
    let mut out = Vec::new();
    for &(gap, len) in pairs {
        let start = at + i64::from(gap);
        let end = start + i64::from(len.max(1));
        out.push((start, end));
        at = end + 1;
    }
    out
}

fn roundtrip(base: i64, handled: &[(i64, i64)], budget: usize) -> (String, bool, HandledRanges) {
    let runs = runs_of(base, handled.iter().copied());
    let (text, cut) = encode(base, &runs, budget);
    let back = decode(base, &text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    (text, cut, back)
}

fn well_formed(base: i64, map: &HandledRanges) {
    let mut last_end = None;
    for &(s, e) in map.ranges() {
        assert!(s > base && s < e, "{map:?}");
        assert!(
            last_end.is_none_or(|l| s > l),
            "not ascending, or adjacent: {map:?}"
        );
        last_end = Some(e);
    }
    assert!(map.len() as i64 <= MAX_METADATA_OFFSETS);
}

#[test]
fn a_parked_record_below_one_record_per_transaction_is_a_few_bytes() {
    // Offset 0 parked; 4,000 records above it, each followed by its commit marker, all
    // handled: markers may count as handled, so the map is two runs (1 and 8,000).
    let handled = [(1, 8_001)];
    let (text, cut, back) = roundtrip(0, &handled, 4096);
    assert!(!cut);
    assert_eq!(text, "tk2:0:rAcA-");
    assert_eq!(back.ranges(), &handled);
}

#[test]
fn the_smaller_encoding_is_written() {
    // Every other offset handled over 2,000 offsets: the bit set (250 bytes) beats 2,000
    // one-byte runs.
    let handled: Vec<(i64, i64)> = (0..1_000)
        .map(|i| (100 + 2 * i + 1, 100 + 2 * i + 2))
        .collect();
    let (text, _, back) = roundtrip(100, &handled, 4096);
    assert!(text.starts_with("tk2:100:b"), "{text}");
    assert_eq!(text.len(), "tk2:100:b".len() + 334);
    assert_eq!(back.ranges(), handled.as_slice());
    // A few long runs: run length.
    let handled = [(1_000_005, 1_200_000), (1_200_001, 1_900_000)];
    let (text, _, back) = roundtrip(1_000_000, &handled, 4096);
    assert!(text.starts_with("tk2:1000000:r"), "{text}");
    assert!(text.len() < 30, "{text}");
    assert_eq!(back.ranges(), &handled);
}

#[test]
fn any_shape_within_24000_offsets_fits_the_default_budget() {
    // The worst shape for run length (every other offset) is the bit set's best case; at the
    // broker's default of 4,096 characters a bit set covers 24,000 offsets whatever they are.
    let base = 9_000_000_000;
    let handled: Vec<(i64, i64)> = (0..12_000)
        .map(|i| (base + 2 * i + 1, base + 2 * i + 2))
        .collect();
    let (text, cut, back) = roundtrip(base, &handled, 4096);
    assert!(!cut && text.len() <= 4096, "{}", text.len());
    assert_eq!(back.ranges(), handled.as_slice());
    assert!(max_len(base + 24_001, 0, None, 24_001) <= 4096);
    // With Kafka's 22-character topic id too.
    assert!(max_len(base + 24_001, 23, None, 24_001) <= 4096);
    let (text, cut) = encode_with_id(Some(KAFKA_ID), base, &runs_of(base, handled), 4096);
    assert!(
        !cut && text.len() <= 4096 && text.starts_with("tk3:"),
        "{}",
        text.len()
    );
}

#[test]
fn a_map_over_the_budget_is_cut_to_a_prefix() {
    let handled: Vec<(i64, i64)> = (0..5_000).map(|i| (3 * i + 1, 3 * i + 2)).collect();
    for budget in [0, 5, 8, 9, 10, 11, 12, 40, 100, 1000] {
        let (text, cut, back) = roundtrip(0, &handled, budget);
        assert!(cut);
        assert!(text.len() <= budget, "{budget}: {text}");
        assert!(
            back.iter().all(|o| (o - 1) % 3 == 0),
            "{budget}: only handled offsets"
        );
        let kept = back.len();
        assert!(
            handled.iter().take(kept).eq(back.ranges().iter()),
            "{budget}: a prefix"
        );
    }
}

#[test]
fn the_first_form_is_still_read() {
    assert_eq!(
        decode(10, "tk1:10:1-3,5,9").unwrap().ranges(),
        &[(11, 14), (15, 16), (19, 20)]
    );
    // Adjacent ranges merge.
    assert_eq!(decode(0, "tk1:0:1-2,3,4-6").unwrap().ranges(), &[(1, 7)]);
    assert_eq!(decode(5, "tk1:5:").unwrap(), HandledRanges::default());
    for refused in [
        "tk1:5:0",
        "tk1:5:x",
        "tk1:5:3,2",
        "tk1:5:1-5,5-9",
        "tk1:5:4-2",
        "tk1:5:-1",
    ] {
        assert!(
            matches!(decode(5, refused), Err(MetadataError::Malformed(_))),
            "{refused}"
        );
    }
    assert_eq!(decode(5, "tk1:4:1"), Err(MetadataError::OtherOffset));
    assert!(decode(10, &format!("tk1:10:1-{}", i64::MAX)).is_err());
    // Fifteen bytes naming a million offsets: kept (below MAX_METADATA_OFFSETS), as one range.
    assert_eq!(
        decode(1, "tk1:1:1-999999").unwrap().ranges(),
        &[(2, 1_000_001)]
    );
    // Past it: the lowest MAX_METADATA_OFFSETS kept.
    let kept = decode(0, &format!("tk1:0:1-{}", i64::MAX - 1)).unwrap();
    assert_eq!(kept.ranges(), &[(1, 1 + MAX_METADATA_OFFSETS)]);
    // Many ranges: one each, bounded by the text's length.
    let many: Vec<String> = (0..1_000).map(|i| format!("{}", 2 * i + 1)).collect();
    let kept = decode(0, &format!("tk1:0:{}", many.join(","))).unwrap();
    assert_eq!(kept.ranges().len(), 1_000);
}

#[test]
fn foreign_hostile_and_other_form_metadata_is_refused_whole() {
    // Kafka Streams (magic 2, partition time, Base64), Parallel Consumer (magic byte, Base64),
    // JSON, text that was not UTF-8 (replacement characters after a lossy conversion).
    for foreign in [
        "AgAAAYvHN2Nf",
        "bgAKAAUA",
        "{\"offset\":5}",
        "\u{FFFD}\u{FFFD}k2:5:r",
        "tk",
        "tk:5",
    ] {
        assert_eq!(decode(5, foreign), Err(MetadataError::Foreign), "{foreign}");
    }
    assert_eq!(
        decode(5, "tk4:5:zz"),
        Err(MetadataError::UnknownForm("tk4".into()))
    );
    assert_eq!(decode(5, "tk2:6:rAQE"), Err(MetadataError::OtherOffset));
    assert_eq!(decode(5, "tk2:05:rAQE"), Err(MetadataError::OtherOffset));
    assert_eq!(decode(5, "tk2:+5:rAQE"), Err(MetadataError::OtherOffset));
    assert_eq!(decode(5, "tk2:5:rAQE").unwrap().ranges(), &[(6, 7)]);
    for malformed in [
        "tk2:5",
        "tk2:5:",
        "tk2:5:r",
        "tk2:5:x AQE",
        "tk2:5:qAQE",
        "tk2:5:rAQE=",
        "tk2:5:rAR",             // Base64 whose unused bits are set
        "tk2:5:rAAE",            // an empty run
        "tk2:5:rAQEB",           // an odd number of runs: ends with a run not handled
        "tk2:5:rgA",             // a varint cut short
        "tk2:5:rgAA",            // a varint not in its shortest form
        "tk2:5:r____________fw", // past 64 bits
    ] {
        assert!(
            matches!(decode(5, malformed), Err(MetadataError::Malformed(_))),
            "{malformed}: {:?}",
            decode(5, malformed)
        );
    }
    let long = format!("tk2:5:b{}", "A".repeat(MAX_METADATA_CHARS));
    assert_eq!(decode(5, &long), Err(MetadataError::TooLong(long.len())));
    // Runs past the last offset.
    let runs = [1u64, i64::MAX as u64];
    let (text, _) = encode(5, &runs, 100);
    assert!(decode(5, &text).is_err(), "{text}");
    // Bits up to the last offset there is (found by the fuzz target's checks).
    let base = i64::MAX - 3;
    for (runs, kept) in [
        ([1u64, 3], (base + 1, i64::MAX)),
        ([2, 2], (base + 2, i64::MAX)),
    ] {
        let (text, _) = encode(base, &runs, 100);
        assert!(text.contains(":b"), "{text}");
        assert_eq!(decode(base, &text).unwrap().ranges(), &[kept], "{text}");
    }
    // A run naming 2^62 offsets: the lowest MAX_METADATA_OFFSETS kept.
    let (text, _) = encode(5, &[1, 1 << 62], 100);
    assert_eq!(
        decode(5, &text).unwrap().ranges(),
        &[(6, 6 + MAX_METADATA_OFFSETS)]
    );
}

#[test]
fn a_cut_text_reads_as_a_prefix_of_its_map_or_not_at_all() {
    let handled = ranges(1_000, &[(0, 3), (1, 1), (7, 2), (0, 9), (300, 1), (2, 2)]);
    for budget in [4096, 30] {
        let runs = runs_of(1_000, handled.iter().copied());
        let (text, _) = encode(1_000, &runs, budget);
        let whole = decode(1_000, &text).unwrap();
        for cut in 0..text.len() {
            if let Ok(part) = decode(1_000, &text[..cut]) {
                well_formed(1_000, &part);
                assert!(part.iter().all(|o| whole.contains(o)), "{}", &text[..cut]);
            }
        }
    }
}

/// Kafka's text of a topic id (URL-safe Base64 of 16 bytes, unpadded).
const KAFKA_ID: &str = "EjRWeJq83vD__________w";

#[test]
fn the_topic_id_is_named_where_known() {
    let runs = runs_of(5, [(6, 7)]);
    // No id, or one that is not a token of the alphabet: `tk2`, as before.
    assert_eq!(encode_with_id(None, 5, &runs, 4096).0, "tk2:5:bAQ");
    for not_written in ["", "a:b", "an id", &"A".repeat(23), "é"] {
        assert_eq!(
            encode_with_id(Some(not_written), 5, &runs, 4096).0,
            "tk2:5:bAQ"
        );
        assert_eq!(topic_id_len(Some(not_written)), 0);
    }
    let (text, cut) = encode_with_id(Some(KAFKA_ID), 5, &runs, 4096);
    assert!(!cut);
    assert_eq!(text, format!("tk3:{KAFKA_ID}:5:bAQ"));
    assert_eq!(text.len(), "tk2:5:bAQ".len() + topic_id_len(Some(KAFKA_ID)));
    let c = decode_committed(5, &text).unwrap();
    assert_eq!(c.topic_id, Some(KAFKA_ID));
    assert_eq!(c.handled.ranges(), &[(6, 7)]);
    assert_eq!(decode(5, &text).unwrap().ranges(), &[(6, 7)]);
    // An empty map is written too, for the id; it reads as no offsets.
    let (text, cut) = encode_with_id(Some("sim-id-1"), 42, &[], 4096);
    assert!(!cut);
    assert_eq!(text, "tk3:sim-id-1:42:");
    let c = decode_committed(42, &text).unwrap();
    assert_eq!((c.topic_id, c.handled.is_empty()), (Some("sim-id-1"), true));
    assert!(text.len() <= max_len(43, topic_id_len(Some("sim-id-1")), Some(0), 0));
    // The older forms and empty text name no id.
    for idless in ["", "tk2:5:rAQE", "tk1:5:1"] {
        assert_eq!(
            decode_committed(5, idless).unwrap().topic_id,
            None,
            "{idless}"
        );
    }
    // A map that does not fit whole with the id is written without it, not cut.
    let budget = "tk2:5:bAQ".len();
    assert_eq!(
        encode_with_id(Some(KAFKA_ID), 5, &runs, budget),
        ("tk2:5:bAQ".into(), false)
    );
    assert_eq!(
        encode_with_id(Some(KAFKA_ID), 5, &[], 10),
        (String::new(), false)
    );
    // Exactly at the budget, the id is kept.
    let exact = format!("tk3:{KAFKA_ID}:5:bAQ").len();
    assert!(encode_with_id(Some(KAFKA_ID), 5, &runs, exact)
        .0
        .starts_with("tk3:"));
}

#[test]
fn a_malformed_topic_id_refuses_the_text_whole() {
    for malformed in [
        "tk3:",
        "tk3:5",
        "tk3::5:rAQE",
        "tk3:a b:5:rAQE",
        "tk3:a+b:5:rAQE",
        "tk3:AAAAAAAAAAAAAAAAAAAAAAA:5:rAQE", // 23 characters
        "tk3:\u{FFFD}:5:rAQE",
        "tk3:id:5",
        "tk3:id:5:r",
        "tk3:id:5:x",
        "tk3:id:5:rAQEB",
    ] {
        assert!(
            matches!(
                decode_committed(5, malformed),
                Err(MetadataError::Malformed(_))
            ),
            "{malformed}: {:?}",
            decode_committed(5, malformed)
        );
    }
    assert_eq!(
        decode_committed(5, "tk3:id:6:rAQE"),
        Err(MetadataError::OtherOffset)
    );
    // The id is one field: a text with more fields is another offset or malformed.
    assert!(decode_committed(5, "tk3:id:x:5:rAQE").is_err());
    assert_eq!(
        decode(5, "tk4:id:5:rAQE"),
        Err(MetadataError::UnknownForm("tk4".into()))
    );
}

/// A map whose runs are `runs`, written with `id` within `budget`, read back: the text,
/// whether it was cut, the id it names and its offsets.
fn roundtrip_with_id(
    id: Option<&str>,
    base: i64,
    runs: &[u64],
    budget: usize,
) -> (String, bool, Option<String>, HandledRanges) {
    let (text, cut) = encode_with_id(id, base, runs, budget);
    let c = decode_committed(base, &text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let (named, handled) = (c.topic_id.map(str::to_owned), c.handled);
    (text, cut, named, handled)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Every handled set survives encode and decode, in the smaller encoding, and within the
    /// bound the start gate computes from its runs, its span and the topic id's length.
    #[test]
    fn every_handled_set_round_trips_within_the_bound(
        base in prop_oneof![0i64..1_000, 0i64..(1 << 53)],
        pairs in prop::collection::vec((prop_oneof![0u32..4, 0u32..300, 0u32..100_000], prop_oneof![1u32..4, 1u32..300]), 0..400),
        id in prop_oneof![Just(None), Just(Some(KAFKA_ID.to_owned())), "[A-Za-z0-9_-]{1,22}".prop_map(Some), ".{0,30}".prop_map(Some)],
    ) {
        let handled = ranges(base, &pairs);
        let runs = runs_of(base, handled.iter().copied());
        let id = id.as_deref();
        let (text, cut) = encode_with_id(id, base, &runs, MAX_METADATA_CHARS);
        let span: u64 = runs.iter().sum();
        prop_assert!(text.is_ascii());
        if !cut {
            // What a map names above MAX_METADATA_OFFSETS is not read.
            let limit = base + 1 + MAX_METADATA_OFFSETS;
            let kept: Vec<(i64, i64)> = handled
                .iter()
                .filter(|(s, _)| *s < limit)
                .map(|&(s, e)| (s, e.min(limit)))
                .collect();
            let back = decode_committed(base, &text).unwrap();
            prop_assert_eq!(back.handled.ranges(), kept.as_slice());
            let named = id.filter(|i| valid_topic_id(i));
            prop_assert_eq!(back.topic_id, named);
            let id_len = topic_id_len(id);
            let top = base + span as i64;
            prop_assert!(text.len() <= max_len(top, id_len, Some(runs.len()), span));
            prop_assert!(text.len() <= max_len(top, id_len, None, span).max(max_len(top, id_len, Some(runs.len()), span)));
            // The same runs bound any other split of a span at least as long.
            prop_assert!(text.len() <= max_len(top + 7, id_len, Some(runs.len() + 3), span + 7));
            // And the bound for the longest id bounds every id.
            prop_assert!(text.len() <= max_len(top, MAX_TOPIC_ID_CHARS + 1, Some(runs.len()), span));
        }
    }

    /// With an id, a map is written whole or not named with the id; either way within the
    /// budget, and naming only handled offsets.
    #[test]
    fn a_map_with_an_id_fits_its_budget(
        base in 0i64..(1 << 40),
        pairs in prop::collection::vec((0u32..50, 1u32..50), 0..200),
        budget in 0usize..300,
        id in "[A-Za-z0-9_-]{1,22}",
    ) {
        let handled = ranges(base, &pairs);
        let runs = runs_of(base, handled.iter().copied());
        let (text, cut, named, back) = roundtrip_with_id(Some(&id), base, &runs, budget);
        prop_assert!(text.len() <= budget);
        let whole = HandledRanges(handled);
        prop_assert!(back.iter().all(|o| whole.contains(o)));
        if named.is_some() {
            prop_assert!(!cut);
            prop_assert_eq!(named.as_deref(), Some(id.as_str()));
            prop_assert_eq!(back.len(), whole.len());
        }
        // Whatever fits the gate's bound with the id is written with it.
        let span: u64 = runs.iter().sum();
        if max_len(base + span as i64, topic_id_len(Some(&id)), Some(runs.len()), span) <= budget {
            prop_assert_eq!(named.as_deref(), Some(id.as_str()));
        }
    }

    /// A map cut to a budget fits it and names only offsets of the whole map.
    #[test]
    fn a_cut_map_fits_and_names_only_handled_offsets(
        base in 0i64..(1 << 40),
        pairs in prop::collection::vec((0u32..50, 1u32..50), 1..200),
        budget in 0usize..300,
    ) {
        let handled = ranges(base, &pairs);
        let runs = runs_of(base, handled.iter().copied());
        let (text, _) = encode(base, &runs, budget);
        prop_assert!(text.len() <= budget);
        let back = decode(base, &text).unwrap();
        let whole = HandledRanges(handled);
        prop_assert!(back.iter().all(|o| whole.contains(o)));
    }

    /// Whatever the text, reading it returns (never panics) a well-formed, bounded map.
    #[test]
    fn any_text_reads_as_a_bounded_map_or_is_refused(
        base in prop_oneof![0i64..10, Just(i64::MAX - 3), 0i64..i64::MAX],
        text in prop_oneof![
            ".*",
            "tk[12]:[0-9]{1,3}:[-0-9,]{0,40}",
            "tk2:[0-9]:[rb][A-Za-z0-9_-]{0,60}",
            "tk3:[A-Za-z0-9_:+/= -]{0,26}:[0-9]:[rb]?[A-Za-z0-9_-]{0,60}",
        ],
    ) {
        if let Ok(c) = decode_committed(base, &text) {
            well_formed(base, &c.handled);
            prop_assert!(c.topic_id.is_none_or(valid_topic_id));
            prop_assert_eq!(c.topic_id.is_some(), text.starts_with("tk3:"));
        }
    }

    /// The fuzz target's checks (`tests/fuzz`, `commit_metadata`) hold on the same inputs.
    #[test]
    fn the_fuzz_target_holds_on_generated_text(
        base in prop_oneof![0i64..10, Just(-1i64), Just(i64::MAX - 3)],
        text in prop_oneof![
            ".*",
            "tk[12]:[0-9]{1,2}:[-0-9,]{0,40}",
            "tk2:[0-9]:[rb][A-Za-z0-9_-]{0,60}",
            "tk3:[A-Za-z0-9_:-]{0,24}:[0-9]:[rb]?[A-Za-z0-9_-]{0,60}",
        ],
    ) {
        crate::fuzz::commit_metadata(base, &text);
        let valid = encode(base.max(0), &[1, 3, 2, 5], 100).0;
        crate::fuzz::commit_metadata(base.max(0), &valid);
        let valid = encode_with_id(Some(KAFKA_ID), base.max(0), &[1, 3, 2, 5], 100).0;
        crate::fuzz::commit_metadata(base.max(0), &valid);
        let empty = encode_with_id(Some(KAFKA_ID), base.max(0), &[], 100).0;
        crate::fuzz::commit_metadata(base.max(0), &empty);
    }

    /// Bytes that are any payload at all, under a well-formed header.
    #[test]
    fn any_payload_reads_as_a_bounded_map_or_is_refused(
        base in 0i64..1_000,
        kind in prop_oneof![Just('r'), Just('b')],
        bytes in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let text = format!("tk2:{base}:{kind}{}", URL_SAFE_NO_PAD.encode(&bytes));
        if let Ok(map) = decode(base, &text) {
            well_formed(base, &map);
        }
    }
}
