#![no_main]
//! A trigger's filter (a CEL expression from the configuration), compiled and evaluated on a
//! record: deeply nested or long expressions must be refused, never overflow the stack.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &str)| {
    tessel_kafka::fuzz::filter(input.0, input.1);
});
