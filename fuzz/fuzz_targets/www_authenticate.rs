//! Fuzzes the `WWW-Authenticate` parser for upstream Bearer challenges. Oracles: a parsed
//! value never holds a control byte other than HTAB (it is echoed to the agent in a header,
//! where CR, LF or NUL would split or cut it); and the challenge the server renders for the
//! agent from it parses back to the same challenge (less the control characters rendering
//! drops), so what the agent is told is what the upstream said.
//!
//! Input: one byte picks the status (401 or 403); the rest is the field lines, split on
//! 0xFF.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpyard::binding::client::bearer::parse;
use mcpyard::fuzzing::render_bearer;
use mcpyard::stream::BearerChallenge;
use mcpyard_fuzz::Input;

fn values(c: &BearerChallenge) -> [&Option<Box<str>>; 5] {
    [
        &c.realm,
        &c.scope,
        &c.error,
        &c.error_description,
        &c.resource_metadata,
    ]
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let status = if input.byte() & 1 == 0 { 401 } else { 403 };
    let lines: Vec<&[u8]> = input.rest().split(|&b| b == 0xFF).collect();
    let Some(challenge) = parse(status, lines.iter().copied()) else {
        return;
    };
    assert_eq!(challenge.status, status);
    for value in values(&challenge).into_iter().flatten() {
        assert!(
            !value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f),
            "control byte in {value:?}"
        );
    }
    let rendered = render_bearer(&challenge);
    let again = parse(status, std::iter::once(rendered.as_bytes()))
        .unwrap_or_else(|| panic!("the rendered challenge {rendered:?} does not parse"));
    let strip = |v: &Option<Box<str>>| -> Option<Box<str>> {
        v.as_ref()
            .map(|v| v.chars().filter(|c| !c.is_control()).collect())
    };
    let want = BearerChallenge {
        status,
        realm: strip(&challenge.realm),
        scope: strip(&challenge.scope),
        error: strip(&challenge.error),
        error_description: strip(&challenge.error_description),
        resource_metadata: strip(&challenge.resource_metadata),
        forwarded: false,
    };
    assert_eq!(again, want, "rendered as {rendered:?}");
});
