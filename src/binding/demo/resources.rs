//! The demo's resources: three static documents listed two per page, the template
//! `demo://items/{id}`, and `resources/read`. Subscriptions are kept on the session
//! ([`super::session::Session::subscribe`]); this module resolves the uris.

use super::DemoShared;
use super::json::{self, Failure, RESOURCE_NOT_FOUND, clip, push_str};
use bytes::Bytes;
use simd_json::BorrowedValue;
use simd_json::prelude::*;

/// Resources per `resources/list` page.
const PAGE_SIZE: usize = 2;

/// The cursor of the second (last) page.
const PAGE_2: &str = "page-2";

/// The template's uri prefix; the rest of the uri is the item id.
const ITEM_PREFIX: &str = "demo://items/";

/// Longest item id; ids are `[A-Za-z0-9_-]`.
const ITEM_ID_BYTES_MAX: usize = 64;

/// A static resource: uri, name, title, MIME type.
struct Static {
    uri: &'static str,
    name: &'static str,
    title: &'static str,
    mime: &'static str,
}

/// The static resources, in list order.
const STATIC: [Static; 3] = [
    Static {
        uri: "demo://readme",
        name: "readme",
        title: "About the demo",
        mime: "text/markdown",
    },
    Static {
        uri: "demo://config",
        name: "config",
        title: "Demo configuration",
        mime: "application/json",
    },
    Static {
        uri: "demo://status",
        name: "status",
        title: "Demo status",
        mime: "text/plain",
    },
];

const _: () = assert!(STATIC.len() > PAGE_SIZE);
const _: () = assert!(STATIC.len() <= 2 * PAGE_SIZE);

const README: &str = "# mcpyard demo toolkit\n\n\
Tools: echo, add, progress, add_tool, remove_tool, touch_resource, log.\n\
Prompts: greet. Resources: demo://readme, demo://config, demo://status and \
demo://items/{id}.\n";

const TEMPLATES: &str = concat!(
    r#"{"resourceTemplates":[{"uriTemplate":"demo://items/{id}","name":"item","#,
    r#""title":"Demo item","description":"An item of the demo, by id.","#,
    r#""mimeType":"text/plain"}]}"#,
);

/// A resource the demo can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resource<'a> {
    /// One of [`STATIC`], by index.
    Static(usize),
    /// `demo://items/{id}`.
    Item(&'a str),
}

/// The resource at `uri`, if the demo has it.
pub(super) fn resolve(uri: &str) -> Option<Resource<'_>> {
    if let Some(i) = STATIC.iter().position(|s| s.uri == uri) {
        return Some(Resource::Static(i));
    }
    let id = uri.strip_prefix(ITEM_PREFIX)?;
    let valid = (1..=ITEM_ID_BYTES_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    valid.then_some(Resource::Item(id))
}

/// The `uri` a resources request is about, required to be one the demo has.
pub(super) fn target_uri<'v>(
    params: &'v BorrowedValue<'_>,
    target: Option<&'v str>,
) -> Result<&'v str, Failure> {
    let Some(uri) = json::name_or_target(params, "uri", target) else {
        return Err(Failure::invalid_params("Missing uri"));
    };
    if resolve(uri).is_none() {
        return Err(not_found(uri));
    }
    Ok(uri)
}

/// MCP's resource-not-found error, with the uri as data.
fn not_found(uri: &str) -> Failure {
    let mut data = Vec::with_capacity(uri.len() + 10);
    data.extend_from_slice(br#"{"uri":"#);
    push_str(&mut data, clip(uri));
    data.push(b'}');
    Failure {
        data: Some(Bytes::from(data)),
        ..Failure::new(RESOURCE_NOT_FOUND, "Resource not found")
    }
}

/// `resources/list`: no cursor gives the first page (with `nextCursor`), `"page-2"` the
/// last; any other cursor is invalid-params.
pub(super) fn list(params: &BorrowedValue<'_>) -> Result<Bytes, Failure> {
    let page = match params.get("cursor") {
        None => 0,
        Some(c) if c.is_null() => 0,
        Some(c) if c.as_str() == Some(PAGE_2) => 1,
        Some(_) => return Err(Failure::invalid_params("Invalid cursor")),
    };
    let start = page * PAGE_SIZE;
    let end = STATIC.len().min(start + PAGE_SIZE);
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(br#"{"resources":["#);
    for (i, resource) in STATIC[start..end].iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(br#"{"uri":"#);
        push_str(&mut out, resource.uri);
        out.extend_from_slice(br#","name":"#);
        push_str(&mut out, resource.name);
        out.extend_from_slice(br#","title":"#);
        push_str(&mut out, resource.title);
        out.extend_from_slice(br#","mimeType":"#);
        push_str(&mut out, resource.mime);
        out.push(b'}');
    }
    out.push(b']');
    if end < STATIC.len() {
        out.extend_from_slice(br#","nextCursor":"#);
        push_str(&mut out, PAGE_2);
    }
    out.push(b'}');
    Ok(Bytes::from(out))
}

/// `resources/templates/list`.
pub(super) fn templates() -> Bytes {
    Bytes::from_static(TEMPLATES.as_bytes())
}

/// `resources/read`: the one text content of the resource at `uri`.
pub(super) fn read(
    params: &BorrowedValue<'_>,
    target: Option<&str>,
    shared: &DemoShared,
) -> Result<Bytes, Failure> {
    let Some(uri) = json::name_or_target(params, "uri", target) else {
        return Err(Failure::invalid_params("Missing uri"));
    };
    let (mime, text) = match resolve(uri) {
        None => return Err(not_found(uri)),
        Some(Resource::Item(id)) => ("text/plain", format!("item {id}")),
        Some(Resource::Static(i)) => (STATIC[i].mime, static_text(i, shared)),
    };
    let mut out = Vec::with_capacity(text.len() + uri.len() + 64);
    out.extend_from_slice(br#"{"contents":[{"uri":"#);
    push_str(&mut out, uri);
    out.extend_from_slice(br#","mimeType":"#);
    push_str(&mut out, mime);
    out.extend_from_slice(br#","text":"#);
    push_str(&mut out, &text);
    out.extend_from_slice(b"}]}");
    Ok(Bytes::from(out))
}

/// The text of static resource `i`.
fn static_text(i: usize, shared: &DemoShared) -> String {
    match STATIC[i].name {
        "readme" => README.to_owned(),
        "config" => {
            let added = shared.added_tools();
            let interval_ms = u64::try_from(shared.progress_interval.as_millis());
            let config = serde_json::json!({
                "progress_interval_ms": interval_ms.unwrap_or(u64::MAX),
                "runtime_tools": added.iter().map(|t| &**t).collect::<Vec<_>>(),
            });
            config.to_string()
        }
        _ => format!("demo status: ok\ntouches: {}\n", shared.touches()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_resolve_to_static_resources_and_items() {
        assert_eq!(resolve("demo://readme"), Some(Resource::Static(0)));
        assert_eq!(resolve("demo://status"), Some(Resource::Static(2)));
        assert_eq!(resolve("demo://items/42"), Some(Resource::Item("42")));
        for bad in [
            "demo://items/",
            "demo://items/a/b",
            "demo://nope",
            "",
            "demo://items/%20",
        ] {
            assert_eq!(resolve(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn templates_are_valid_json() {
        let v: serde_json::Value = serde_json::from_slice(&templates()).expect("JSON");
        assert_eq!(
            v["resourceTemplates"][0]["uriTemplate"],
            "demo://items/{id}"
        );
    }
}
