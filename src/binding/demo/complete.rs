//! `completion/complete`: argument values for the `greet` prompt's `style` and the
//! `demo://items/{id}` template's `id`, filtered by the prefix typed so far.

use super::json::{Args, Failure, clip, push_str};
use super::prompts::{GREET, STYLES};
use bytes::Bytes;
use simd_json::BorrowedValue;

/// Item ids the template offers.
const ITEM_IDS: [&str; 3] = ["1", "2", "42"];

/// The uri template whose `id` completes.
const ITEM_TEMPLATE: &str = "demo://items/{id}";

/// Completes `argument.value` for `ref`. Arguments the demo has no values for complete to
/// nothing; an unknown prompt, template or ref type is invalid-params.
pub(super) fn complete(params: &BorrowedValue<'_>) -> Result<Bytes, Failure> {
    let reference = Args::of(params, "ref")?;
    let argument = Args::of(params, "argument")?;
    let Some(argument_name) = argument.str("name") else {
        return Err(Failure::invalid_params("Missing argument.name"));
    };
    let prefix = argument.str("value").unwrap_or("");
    let candidates: &[&str] = match reference.str("type") {
        Some("ref/prompt") => {
            let name = reference.str("name").unwrap_or("");
            if name != GREET {
                let message = format!("Unknown prompt: {}", clip(name));
                return Err(Failure::invalid_params(message));
            }
            if argument_name == "style" {
                &STYLES
            } else {
                &[]
            }
        }
        Some("ref/resource") => {
            let uri = reference.str("uri").unwrap_or("");
            if uri != ITEM_TEMPLATE {
                let message = format!("Unknown resource template: {}", clip(uri));
                return Err(Failure::invalid_params(message));
            }
            if argument_name == "id" {
                &ITEM_IDS
            } else {
                &[]
            }
        }
        _ => return Err(Failure::invalid_params("Invalid ref type")),
    };
    let mut out = Vec::with_capacity(96);
    out.extend_from_slice(br#"{"completion":{"values":["#);
    let mut total = 0usize;
    for value in candidates.iter().filter(|v| v.starts_with(prefix)) {
        if total > 0 {
            out.push(b',');
        }
        push_str(&mut out, value);
        total += 1;
    }
    out.extend_from_slice(format!(r#"],"total":{total},"hasMore":false}}}}"#).as_bytes());
    Ok(Bytes::from(out))
}
