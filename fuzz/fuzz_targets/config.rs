// Fuzz target: the configuration loader (YAML → `Config`, then validation) on arbitrary UTF-8.
// Beyond "no panic": every rejection names the file, so a user can find what was wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwatch::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Config::from_yaml(text, "fuzz.yaml") {
        let message = e.to_string();
        assert!(message.starts_with("fuzz.yaml"), "an error that does not name the file: {message}");
    }
});
