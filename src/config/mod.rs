//! The configuration file: one YAML file, read and validated once at start-up.
//!
//! `main` calls [`load`]; everything after it works from the returned [`Config`], which is
//! complete (defaults filled in) and consistent (every cross-reference checked). An invalid
//! file yields one [`ConfigError`] whose `Display` is the single line mcpyard prints before
//! it exits: the file, the key path, what was found and what was expected, e.g.
//! `gw.yaml: bindings.tools.routes[1].exit: found "nope", expected the name of a binding (one of: github, north, time)`.
//!
//! Reading happens in four steps, each refusing what the next should not see:
//! 1. YAML text → a plain YAML tree (syntax errors carry line and column);
//! 2. per-kind key check on the bindings (`raw::check_binding_keys`);
//! 3. tree → `raw` types through `serde_path_to_error`, which names the key path of any
//!    unknown key or bad value (`raw.rs`);
//! 4. `raw` → `model`, with defaults, bounds and cross-references (`validate.rs`).
//!
//! Two small pieces live in modules of their own because the proxy binding uses them at
//! run time too: `glob.rs` (route allow-lists, [`AllowList::admits`]) and
//! `event_prefix.rs` (the per-route tags of aggregate event ids, [`event_prefixes`]).
//!
//! The file layout is documented in `config/quickstart.yaml` and
//! `config/proxy-example.yaml`, and in the README's configuration table.

mod auth;
mod duration;
mod event_prefix;
mod glob;
mod model;
mod raw;
mod text;
mod url;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::io::Read;
use std::path::Path;

use serde_yaml_ng::Value;

pub use auth::{AUTH_LIMITS_MAX, AUTH_RULES_MAX};
pub use duration::{format_duration, parse_duration};
pub use event_prefix::{EVENT_CODE_CHARS, event_code, event_prefixes};
pub use glob::{ALLOW_LIST_GLOBS_MAX, AllowList, GLOB_BYTES_MAX, Glob, resource_uri_is_normal};
pub use model::{
    Binding, Cache, ClientAuth, ClientBinding, Config, DemoBinding, IoMode, JwksSource, Jwt, Limit,
    ProxyBinding, RedisStore, RedisTls, RedisUrl, Route, Rule, Runtime, Scheme, Secret, ServerAuth,
    ServerBinding, ServerTls, Store, Telemetry, UpstreamUrl,
};

/// Largest config file read; a config is a few kilobytes, so anything near this is a mistake.
pub const CONFIG_BYTES_MAX: usize = 1024 * 1024;

/// Why a config file was refused: the file, the key path and a `found …, expected …`
/// message. `Display` writes the one line to print, `file: path: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    file: String,
    path: String,
    message: String,
}

impl ConfigError {
    fn new(file: &str, path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_owned(),
            path: path.into(),
            message: message.into(),
        }
    }

    /// The file name, as given to [`load`] or [`load_str`].
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The key path such as `bindings.north.listen`; empty when the problem is the whole
    /// file (unreadable, or not YAML).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What was found and what was expected.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Reads and validates the config file at `path`.
///
/// Returns the validated config, whose `source` is `path` as displayed, or the first
/// problem found, including an unreadable file or one over [`CONFIG_BYTES_MAX`].
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let source = path.display().to_string();
    let unreadable =
        |e: std::io::Error| ConfigError::new(&source, "", format!("cannot read the file: {e}"));
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(CONFIG_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() > CONFIG_BYTES_MAX {
        return Err(ConfigError::new(
            &source,
            "",
            format!("found a file over {CONFIG_BYTES_MAX} bytes, expected a config file"),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        ConfigError::new(
            &source,
            "",
            "found bytes that are not UTF-8, expected a UTF-8 text file",
        )
    })?;
    load_str(&text, &source)
}

/// Validates config text; `source` is the file name used in messages and in
/// [`Config::source`].
///
/// Returns the validated config or the first problem found. Bearer credentials have their
/// `${NAME}` references replaced from the process environment.
pub fn load_str(text: &str, source: &str) -> Result<Config, ConfigError> {
    let tree: Value = serde_yaml_ng::from_str(text).map_err(|e| syntax_error(source, &e))?;
    // An empty file is an empty mapping, which then lacks `bindings`.
    let tree = match tree {
        Value::Null => Value::Mapping(Default::default()),
        tree => tree,
    };
    raw::check_binding_keys(&tree)
        .map_err(|(path, message)| ConfigError::new(source, path, message))?;
    let raw: raw::RawConfig = serde_path_to_error::deserialize(tree).map_err(|e| {
        let (path, message) = humanize(e.path(), &e.inner().to_string());
        ConfigError::new(source, path, message)
    })?;
    validate::validate(raw, source).map_err(|f| ConfigError::new(source, f.path, f.message))
}

/// A YAML syntax error as `line L column C: problem`, without the parser's own repeat of
/// the position.
fn syntax_error(source: &str, e: &serde_yaml_ng::Error) -> ConfigError {
    let text = e.to_string();
    let message = match e.location() {
        Some(at) => {
            let (line, column) = (at.line(), at.column());
            let text = text.replacen(&format!(" at line {line} column {column}"), "", 1);
            format!("line {line} column {column}: invalid YAML: {text}")
        }
        None => format!("invalid YAML: {text}"),
    };
    ConfigError::new(source, "", message)
}

/// Rewrites serde's generic messages (the ones `raw.rs` leaf parsers do not produce
/// themselves) into the `found …, expected …` form, and returns the key path to report.
fn humanize(path: &serde_path_to_error::Path, message: &str) -> (String, String) {
    let mut path = path.to_string();
    if path == "." {
        path.clear();
    }
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (key, expected) = rest.split_once("`, expected ").unwrap_or((rest, ""));
        // serde_path_to_error ends the path with the unknown key; add it if it ever does not.
        if path != key && !path.ends_with(&format!(".{key}")) {
            path = if path.is_empty() {
                key.to_owned()
            } else {
                format!("{path}.{key}")
            };
        }
        let keys = expected
            .trim_start_matches("one of ")
            .replace('`', "")
            .replace(" or ", ", ");
        let message = if expected.is_empty() || expected == "there are no fields" {
            "unknown key, no keys are allowed here".to_owned()
        } else if keys.contains(", ") {
            format!("unknown key, expected one of: {keys}")
        } else {
            format!("unknown key, expected {keys}")
        };
        return (path, message);
    }
    if let Some(key) = message.strip_prefix("missing field `") {
        return (path, format!("missing key {}", key.trim_end_matches('`')));
    }
    let found_expected = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
        .and_then(|rest| rest.split_once(", expected "));
    if let Some((found, expected)) = found_expected {
        return (
            path,
            format!(
                "found {}, expected {}",
                found_phrase(found),
                expected_phrase(expected)
            ),
        );
    }
    (path, message.to_owned())
}

/// serde's `Unexpected` wording as a `found …` phrase: `string "x"` → `"x"`,
/// `integer `5`` → `5`, `map` → `a mapping`.
fn found_phrase(found: &str) -> String {
    if let Some(quoted) = found.strip_prefix("string ") {
        return quoted.to_owned();
    }
    match found {
        "map" => "a mapping".to_owned(),
        "sequence" => "a list".to_owned(),
        "unit value" | "null" => "nothing".to_owned(),
        _ => match found.split_once(" `") {
            Some((_, value)) => value.trim_end_matches('`').to_owned(),
            None => found.to_owned(),
        },
    }
}

/// serde's `expecting` wording in the file's vocabulary.
fn expected_phrase(expected: &str) -> &str {
    match expected {
        "a map" => "a mapping",
        "a sequence" => "a list",
        other => other,
    }
}
