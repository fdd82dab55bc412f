//! Fuzzes the proxy's aggregate event-id codec (`Prefixes::encode` / `decode`, with their
//! escaping) over route prefixes made by the config's own prefix generator. Oracles: the
//! aggregate of any route ids decodes back to exactly the routes with an id that can go
//! upstream and read back unchanged there (non-empty, no control byte but HTAB, no SP or
//! HTAB at either end, since it becomes a `Last-Event-ID`), each with its id byte for byte; the aggregate has one `<prefix>=<id>` pair per route with an
//! id, and no control byte; and decoding arbitrary text yields distinct known routes with
//! such ids, which encode and decode back to themselves.
//!
//! Input: one byte picks the number of routes (1 to 6), one which routes take no part (no
//! prefix), one which have no id; then, split on 0xFF, the toolkit names, the route ids, and
//! arbitrary text to decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpyard::config::event_prefixes;
use mcpyard::fuzzing::EventPrefixes;
use mcpyard::http::field_value_round_trips;
use mcpyard_fuzz::Input;

/// True for a route id the codec may hand on: it goes into a `Last-Event-ID` header, which
/// HTTP trims, so it must read back byte for byte.
fn usable(id: &str) -> bool {
    field_value_round_trips(id.as_bytes())
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let routes = usize::from(input.byte() % 6) + 1;
    let unprefixed = input.byte();
    let idless = input.byte();
    let mut fields = input.rest().split(|&b| b == 0xFF);
    let mut next = || String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
    let toolkits: Vec<String> = (0..routes).map(|i| format!("{i}{}", next())).collect();
    let ids: Vec<String> = (0..routes).map(|_| next()).collect();
    let arbitrary = next();

    let names: Vec<&str> = toolkits.iter().map(String::as_str).collect();
    let Ok(codes) = event_prefixes(&names) else {
        // Two toolkits whose codes collide: the config refuses them.
        return;
    };
    let prefixes: Vec<Option<&str>> = codes
        .iter()
        .enumerate()
        .map(|(i, code)| (unprefixed & (1 << i) == 0).then_some(code.as_str()))
        .collect();
    let codec = EventPrefixes::new(&prefixes);
    let ids: Vec<Option<&str>> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (idless & (1 << i) == 0).then_some(id.as_str()))
        .collect();

    // The routes that name a position, in the aggregate's (prefix) order.
    let mut order: Vec<usize> = (0..routes).filter(|&i| prefixes[i].is_some()).collect();
    order.sort_by_key(|&i| prefixes[i]);
    let named: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| ids[i].is_some())
        .collect();
    let aggregate = codec.encode(&ids);
    assert_eq!(
        aggregate.is_some(),
        !named.is_empty(),
        "aggregate {aggregate:?}"
    );
    if let Some(aggregate) = &aggregate {
        assert!(
            !aggregate.bytes().any(|b| b < 0x20 || b == 0x7f),
            "control byte in {aggregate:?}"
        );
        let pairs: Vec<&str> = aggregate.split(';').collect();
        assert_eq!(pairs.len(), named.len(), "pairs of {aggregate:?}");
        for (pair, &route) in pairs.iter().zip(&named) {
            let (prefix, _) = pair.split_once('=').expect("a pair has `=`");
            assert_eq!(Some(prefix), prefixes[route], "pair {pair:?}");
            assert_eq!(pair.matches('=').count(), 1, "unescaped `=` in {pair:?}");
        }
        let want: Vec<(usize, String)> = named
            .iter()
            .filter_map(|&i| ids[i].filter(|id| usable(id)).map(|id| (i, id.to_owned())))
            .collect();
        assert_eq!(codec.decode(aggregate), want, "round trip of {aggregate:?}");
    }

    // Arbitrary text: what decodes is well formed and survives a round trip.
    let mut decoded = codec.decode(&arbitrary);
    decoded.sort();
    for pair in decoded.windows(2) {
        assert_ne!(pair[0].0, pair[1].0, "a route twice in {arbitrary:?}");
    }
    for (route, id) in &decoded {
        assert!(
            *route < routes && prefixes[*route].is_some(),
            "route {route}"
        );
        assert!(usable(id), "unusable id {id:?} from {arbitrary:?}");
    }
    let mut again: Vec<Option<&str>> = vec![None; routes];
    for (route, id) in &decoded {
        again[*route] = Some(id);
    }
    if let Some(aggregate) = codec.encode(&again) {
        let mut back = codec.decode(&aggregate);
        back.sort();
        assert_eq!(back, decoded, "{arbitrary:?} re-encoded as {aggregate:?}");
    } else {
        assert!(decoded.is_empty());
    }
});
