//! Fuzzes the config loader on YAML text: whatever the text, `load_str` returns a config
//! or an error, never panics, and says the same thing when asked twice.
//!
//! Input: the config file's text (inputs that are not UTF-8 are skipped, as `load` refuses
//! them before parsing).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpyard::config::load_str;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let first = load_str(text, "fuzz.yaml");
    if let Err(e) = &first {
        assert!(!e.to_string().is_empty());
        assert_eq!(
            load_str(text, "fuzz.yaml").err().as_ref(),
            Some(e),
            "a second load differs"
        );
    }
});
