//! The demo's prompts: `greet`, with a required `name` and an optional `style`.

use super::json::{self, Args, Failure, clip, push_str};
use bytes::Bytes;
use simd_json::BorrowedValue;

/// The one prompt's name.
pub(super) const GREET: &str = "greet";

/// Values of `greet`'s `style` argument.
pub(super) const STYLES: [&str; 2] = ["formal", "casual"];

const LIST: &str = concat!(
    r#"{"prompts":[{"name":"greet","title":"Greeting","#,
    r#""description":"Asks the model to greet someone.","#,
    r#""arguments":[{"name":"name","description":"Who to greet.","required":true},"#,
    r#"{"name":"style","description":"formal or casual.","required":false}]}]}"#,
);

/// `prompts/list`.
pub(super) fn list() -> Bytes {
    Bytes::from_static(LIST.as_bytes())
}

/// `prompts/get`: the `greet` messages for its arguments. Unknown prompts, a missing
/// `name` and an unknown `style` are invalid-params (MCP: prompts "Error Handling").
pub(super) fn get(params: &BorrowedValue<'_>, target: Option<&str>) -> Result<Bytes, Failure> {
    let Some(prompt) = json::name_or_target(params, "name", target) else {
        return Err(Failure::invalid_params("Missing prompt name"));
    };
    if prompt != GREET {
        let message = format!("Unknown prompt: {}", clip(prompt));
        return Err(Failure::invalid_params(message));
    }
    let args = Args::of(params, "arguments")?;
    let Some(who) = args.str("name") else {
        return Err(Failure::invalid_params("Missing required argument: name"));
    };
    let style = match args.get("style") {
        None => None,
        Some(_) => match args.str("style") {
            Some(style) if STYLES.contains(&style) => Some(style),
            _ => {
                return Err(Failure::invalid_params(
                    "Invalid argument style: expected formal or casual",
                ));
            }
        },
    };
    let text = match style {
        Some("formal") => format!("Please write a formal greeting addressed to {who}."),
        Some(_) => format!("Say hi to {who} in a relaxed, casual way."),
        None => format!("Please greet {who}."),
    };
    let mut out = Vec::with_capacity(2 * who.len() + 128);
    out.extend_from_slice(br#"{"description":"#);
    push_str(&mut out, &format!("A greeting for {who}"));
    out.extend_from_slice(br#","messages":[{"role":"user","content":{"type":"text","text":"#);
    push_str(&mut out, &text);
    out.extend_from_slice(b"}}]}");
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn list_is_valid_json() {
        let v: serde_json::Value = serde_json::from_slice(&super::list()).expect("JSON");
        assert_eq!(v["prompts"][0]["name"], super::GREET);
    }
}
