#![no_main]
//! Retry-After values, traceparent headers and URL redaction over arbitrary text.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    tessel_kafka::fuzz::dispatcher_answer(text);
});
